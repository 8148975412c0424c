//! The workloads by name: what `--workloads` chooses, and the instance each makes.

use serde::Serialize;

use super::workloads::{Params, Workload};
use super::{tpcc, twitter, ycsb};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// 50 % GET, 50 % SET of Zipf(0.99) keys.
    YcsbA,
    /// 95 % GET, 5 % SET.
    YcsbB,
    /// 50 % GET, 50 % read-modify-write (GET then SET).
    YcsbF,
    /// A retwis-like Twitter clone: timeline, post, follow.
    Twitter,
    /// A TPC-C-like New-Order / Payment / Order-Status mix over Redis hashes.
    Tpcc,
}

impl WorkloadKind {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::YcsbA => "ycsb-a",
            WorkloadKind::YcsbB => "ycsb-b",
            WorkloadKind::YcsbF => "ycsb-f",
            WorkloadKind::Twitter => "twitter",
            WorkloadKind::Tpcc => "tpcc",
        }
    }

    /// The operations and their shares, in words.
    pub fn mix(self) -> &'static str {
        match self {
            WorkloadKind::YcsbA => "50 % read (GET), 50 % update (SET); Zipf 0.99 keys",
            WorkloadKind::YcsbB => "95 % read (GET), 5 % update (SET); Zipf 0.99 keys",
            WorkloadKind::YcsbF => {
                "50 % read (GET), 50 % read-modify-write (GET + SET, one update); Zipf 0.99 keys"
            }
            WorkloadKind::Twitter => {
                "50 % timeline (LRANGE 0 9 + HMGET of each post), 40 % post (INCR id, HMSET \
                 post, SRANDMEMBER 10 followers, MULTI/EXEC of LPUSH+LTRIM onto the author's and \
                 the followers' timelines), 10 % follow (SADD both sets)"
            }
            WorkloadKind::Tpcc => {
                "45 % New-Order (district lock SET NX PX, reads, HMSETs of district, order, \
                 5-15 order lines and customer, stock by EVAL, unlock by EVAL compare-and-\
                 delete), 43 % Payment (customer read, MULTI/EXEC of HINCRBYs, history \
                 HMSET), 12 % Order-Status (reads)"
            }
        }
    }
}

/// The workload `kind`, sized and seeded by `params`.
pub fn make(kind: WorkloadKind, params: &Params) -> Box<dyn Workload> {
    match kind {
        WorkloadKind::YcsbA => Box::new(ycsb::Ycsb::new(ycsb::Mix::A, params)),
        WorkloadKind::YcsbB => Box::new(ycsb::Ycsb::new(ycsb::Mix::B, params)),
        WorkloadKind::YcsbF => Box::new(ycsb::Ycsb::new(ycsb::Mix::F, params)),
        WorkloadKind::Twitter => Box::new(twitter::Twitter::new(params)),
        WorkloadKind::Tpcc => Box::new(tpcc::Tpcc::new(params)),
    }
}
