//! Wing & Gong's search with Lowe's memoisation.

use std::fmt::Debug;
use std::hash::Hash;

use hashbrown::{HashMap, HashSet};

use crate::{Model, Operation, Verdict};

const NIL: usize = usize::MAX;
/// The list's sentinel node; events are nodes `1..`.
const HEAD: usize = 0;

/// A call or a return, in the order of their times.
#[derive(Debug, Clone, Copy)]
struct Event {
    op: usize,
    /// For a call: the node of its return. For a return: `NIL`.
    matching: usize,
}

/// The events not linearized yet, as a doubly linked list over node indices.
struct Events {
    events: Vec<Event>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

impl Events {
    fn new<I, O>(history: &[Operation<I, O>]) -> Events {
        // (time, 0 for a call / 1 for a return, op): at equal times calls come first, so two
        // operations that touch at an instant count as concurrent.
        let mut order: Vec<(u64, u8, usize)> = Vec::with_capacity(history.len() * 2);
        for (op, operation) in history.iter().enumerate() {
            order.push((operation.call, 0, op));
            order.push((operation.ret.max(operation.call), 1, op));
        }
        order.sort_unstable();
        let mut return_node = vec![NIL; history.len()];
        for (position, &(_, kind, op)) in order.iter().enumerate() {
            if kind == 1 {
                return_node[op] = position + 1;
            }
        }
        let mut events = vec![Event {
            op: NIL,
            matching: NIL,
        }];
        events.extend(order.iter().map(|&(_, kind, op)| Event {
            op,
            matching: if kind == 0 { return_node[op] } else { NIL },
        }));
        let count = events.len();
        let next = (0..count)
            .map(|node| if node + 1 < count { node + 1 } else { NIL })
            .collect();
        let prev = (0..count)
            .map(|node| if node == 0 { NIL } else { node - 1 })
            .collect();
        Events { events, next, prev }
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }

    /// Take a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.events[call].matching);
    }

    /// Put them back (in the reverse order of [`Events::lift`]).
    fn unlift(&mut self, call: usize) {
        self.relink(self.events[call].matching);
        self.relink(call);
    }
}

/// The set of linearized operations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bits(Vec<u64>);

impl Bits {
    fn new(count: usize) -> Bits {
        Bits(vec![0; count.div_ceil(64)])
    }
    fn set(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }
    fn clear(&mut self, index: usize) {
        self.0[index / 64] &= !(1 << (index % 64));
    }
}

/// Whether `history` is linearizable under `model`, searching at most `budget` steps.
pub fn check<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    budget: u64,
) -> Verdict {
    match search(model, history, budget) {
        Ok(()) => Verdict::Linearizable,
        Err(Failure::Stuck { linearized, stuck }) => Verdict::NotLinearizable {
            key: None,
            linearized,
            stuck,
        },
        Err(Failure::Budget(steps)) => Verdict::Unknown { key: None, steps },
    }
}

/// Whether every key's operations in `history` are linearizable under `model` (a fresh model
/// state per key), with a budget of steps per key. The first key that is not (or cannot be
/// decided) is named in the verdict, and `stuck` is an index into `history`.
pub fn check_by_key<K, M>(model: &M, history: &[(K, ModelOperation<M>)], budget: u64) -> Verdict
where
    K: Hash + Eq + Clone + Debug,
    M: Model,
    M::Input: Clone,
    M::Output: Clone,
{
    let mut keys: Vec<K> = Vec::new();
    let mut by_key: HashMap<K, Vec<usize>> = HashMap::new();
    for (index, (key, _)) in history.iter().enumerate() {
        by_key
            .entry(key.clone())
            .or_insert_with(|| {
                keys.push(key.clone());
                Vec::new()
            })
            .push(index);
    }
    for key in keys {
        let indices = &by_key[&key];
        let operations: Vec<Operation<M::Input, M::Output>> = indices
            .iter()
            .map(|&index| history[index].1.clone())
            .collect();
        match search(model, &operations, budget) {
            Ok(()) => {}
            Err(Failure::Stuck { linearized, stuck }) => {
                return Verdict::NotLinearizable {
                    key: Some(format!("{key:?}")),
                    linearized,
                    stuck: indices[stuck],
                }
            }
            Err(Failure::Budget(steps)) => {
                return Verdict::Unknown {
                    key: Some(format!("{key:?}")),
                    steps,
                }
            }
        }
    }
    Verdict::Linearizable
}

/// An operation of `M`'s inputs and outputs.
pub type ModelOperation<M> = Operation<<M as Model>::Input, <M as Model>::Output>;

enum Failure {
    Stuck { linearized: usize, stuck: usize },
    Budget(u64),
}

fn search<M: Model>(
    model: &M,
    history: &[Operation<M::Input, M::Output>],
    budget: u64,
) -> Result<(), Failure> {
    let mut list = Events::new(history);
    let mut linearized = Bits::new(history.len());
    let mut seen: HashSet<(Bits, M::State)> = HashSet::new();
    let mut state = model.init();
    // The calls linearized so far, each with the state before it.
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut deepest = 0;
    // The operation that could not be linearized in time at the deepest point reached: the
    // return met there, with its depth.
    let mut stuck: Option<(usize, usize)> = None;
    let mut steps = 0u64;
    let mut entry = list.next[HEAD];
    while list.next[HEAD] != NIL {
        steps += 1;
        if steps > budget {
            return Err(Failure::Budget(steps));
        }
        // Every call's return follows it in the list, so the walk meets a return before the
        // list's end: `entry` is never NIL here.
        let event = list.events[entry];
        if event.matching != NIL {
            let operation = &history[event.op];
            if let Some(after) = model.step(&state, &operation.input, &operation.output) {
                let mut with = linearized.clone();
                with.set(event.op);
                if seen.insert((with.clone(), after.clone())) {
                    stack.push((entry, std::mem::replace(&mut state, after)));
                    linearized = with;
                    list.lift(entry);
                    deepest = deepest.max(stack.len());
                    entry = list.next[HEAD];
                    continue;
                }
            }
            entry = list.next[entry];
        } else {
            // The operation this return ends was not linearized in time: undo the last choice.
            if stuck.is_none_or(|(depth, _)| stack.len() > depth) {
                stuck = Some((stack.len(), event.op));
            }
            let Some((call, before)) = stack.pop() else {
                return Err(Failure::Stuck {
                    linearized: deepest,
                    stuck: stuck.map_or(event.op, |(_, op)| op),
                });
            };
            list.unlift(call);
            linearized.clear(list.events[call].op);
            state = before;
            entry = list.next[call];
        }
    }
    Ok(())
}
