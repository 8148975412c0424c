//! The checker against histories whose answer is known: hand-made ones, and random histories of
//! a real register (linearizable by construction), then with one read changed to a value no
//! write gave (never linearizable).
//!
//! Randomised: the seed is printed; `PMNET_SEED=N` replays it.

use pmnet_lincheck::{
    check, check_by_key, Operation, Register, RegisterInput, RegisterOutput, Verdict, PENDING,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Op = Operation<RegisterInput<u32>, RegisterOutput<u32>>;

fn write(client: u64, call: u64, ret: u64, value: u32) -> Op {
    Operation {
        client,
        call,
        ret,
        input: RegisterInput::Write(Some(value)),
        output: RegisterOutput::Written,
    }
}

fn read(client: u64, call: u64, ret: u64, value: Option<u32>) -> Op {
    Operation {
        client,
        call,
        ret,
        input: RegisterInput::Read,
        output: RegisterOutput::Value(value),
    }
}

const BUDGET: u64 = 10_000_000;

fn seed() -> u64 {
    let seed = std::env::var("PMNET_SEED")
        .ok()
        .map(|text| text.trim().parse().expect("PMNET_SEED must be a u64"))
        .unwrap_or_else(rand::random);
    eprintln!("PMNET_SEED={seed}");
    seed
}

#[test]
fn a_read_after_a_completed_write_must_see_it() {
    let model = Register::default();
    // The write returned at 10; a read called at 20 saw the old value: not linearizable.
    let stale = [write(1, 0, 10, 7), read(2, 20, 30, None)];
    assert!(matches!(
        check(&model, &stale, BUDGET),
        Verdict::NotLinearizable { stuck: 1, .. }
    ));
    // Seeing the new value is.
    let fresh = [write(1, 0, 10, 7), read(2, 20, 30, Some(7))];
    assert_eq!(check(&model, &fresh, BUDGET), Verdict::Linearizable);
}

#[test]
fn a_read_concurrent_with_a_write_may_see_either_value() {
    let model = Register::default();
    for seen in [None, Some(7)] {
        let history = [write(1, 0, 20, 7), read(2, 5, 15, seen)];
        assert_eq!(check(&model, &history, BUDGET), Verdict::Linearizable);
    }
    let never_written = [write(1, 0, 20, 7), read(2, 5, 15, Some(8))];
    assert!(!check(&model, &never_written, BUDGET).is_linearizable());
}

#[test]
fn two_reads_cannot_see_a_write_come_and_go() {
    let model = Register::default();
    // Reader 2 saw the new value and then, after it returned, reader 3 saw the old one.
    let history = [
        write(1, 0, 100, 7),
        read(2, 10, 20, Some(7)),
        read(3, 30, 40, None),
    ];
    assert!(!check(&model, &history, BUDGET).is_linearizable());
}

#[test]
fn a_pending_write_may_or_may_not_take_effect() {
    let model = Register::default();
    let pending = Operation {
        client: 1,
        call: 0,
        ret: PENDING,
        input: RegisterInput::Write(Some(7)),
        output: RegisterOutput::Unknown,
    };
    for seen in [None, Some(7)] {
        let history = [pending.clone(), read(2, 50, 60, seen)];
        assert_eq!(check(&model, &history, BUDGET), Verdict::Linearizable);
    }
    // Once a read has seen it, a later read cannot miss it.
    let history = [pending, read(2, 50, 60, Some(7)), read(3, 70, 80, None)];
    assert!(!check(&model, &history, BUDGET).is_linearizable());
}

#[test]
fn keys_are_checked_apart_and_the_failing_key_is_named() {
    let model = Register::default();
    let history = vec![
        ("a", write(1, 0, 10, 1)),
        ("b", write(1, 11, 20, 2)),
        ("a", read(2, 21, 30, Some(1))),
        ("b", read(2, 31, 40, None)),
    ];
    match check_by_key(&model, &history, BUDGET) {
        Verdict::NotLinearizable { key, stuck, .. } => {
            assert_eq!(key.as_deref(), Some("\"b\""));
            assert_eq!(stuck, 3);
        }
        other => panic!("expected key b to fail, got {other:?}"),
    }
}

#[test]
fn a_budget_too_small_is_unknown_not_a_pass() {
    let model = Register::default();
    let history: Vec<Op> = (0..20).map(|i| write(i, 0, 100, i as u32)).collect();
    assert!(matches!(
        check(&model, &history, 3),
        Verdict::Unknown { .. }
    ));
}

/// A random history of `clients` clients doing `ops` operations each on one register: every
/// operation takes effect at a point inside its [call, ret] interval, in the order of those
/// points, so the history is linearizable; some operations never return.
fn random_history(rng: &mut StdRng, clients: u64, ops: usize) -> Vec<Op> {
    // (effect time, client, call, ret, is write, value)
    let mut planned = Vec::new();
    for client in 0..clients {
        let mut time = rng.random_range(0..50u64);
        for _ in 0..ops {
            let call = time + rng.random_range(1..20u64);
            let effect = call + rng.random_range(0..30u64);
            let ret = effect + rng.random_range(0..30u64);
            let is_write = rng.random_bool(0.5);
            planned.push((
                effect,
                client,
                call,
                ret,
                is_write,
                rng.random_range(0..5u32),
            ));
            time = ret;
        }
    }
    planned.sort_by_key(|&(effect, client, ..)| (effect, client));
    let mut value = None;
    let mut history = Vec::new();
    for (_, client, call, ret, is_write, written) in planned {
        let lost = rng.random_bool(0.05);
        history.push(if is_write {
            value = Some(written);
            Operation {
                client,
                call,
                ret: if lost { PENDING } else { ret },
                input: RegisterInput::Write(Some(written)),
                output: if lost {
                    RegisterOutput::Unknown
                } else {
                    RegisterOutput::Written
                },
            }
        } else {
            read(client, call, ret, value)
        });
    }
    history
}

#[test]
fn random_histories_of_a_real_register_are_linearizable_and_changed_ones_are_not() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let model = Register::default();
    for round in 0..300 {
        let clients = rng.random_range(1..6u64);
        let ops = rng.random_range(1..40usize);
        let history = random_history(&mut rng, clients, ops);
        assert_eq!(
            check(&model, &history, BUDGET),
            Verdict::Linearizable,
            "seed {seed}, round {round}: a register's own history was refused"
        );
        // A read of a value no write ever gave cannot be linearized.
        let reads: Vec<usize> = (0..history.len())
            .filter(|&index| history[index].input == RegisterInput::Read)
            .collect();
        if reads.is_empty() {
            continue;
        }
        let mut changed = history.clone();
        let victim = reads[rng.random_range(0..reads.len())];
        changed[victim].output = RegisterOutput::Value(Some(1000));
        assert!(
            matches!(
                check(&model, &changed, BUDGET),
                Verdict::NotLinearizable { .. }
            ),
            "seed {seed}, round {round}: a read of a value never written passed"
        );
    }
}

#[test]
fn long_histories_of_many_keys_are_checked_within_the_budget() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let model = Register::default();
    let mut history = Vec::new();
    for key in 0..50u32 {
        for operation in random_history(&mut rng, 8, 50) {
            history.push((key, operation));
        }
    }
    assert_eq!(
        check_by_key(&model, &history, BUDGET),
        Verdict::Linearizable,
        "seed {seed}"
    );
}
