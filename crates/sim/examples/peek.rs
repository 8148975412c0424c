fn main() {
    let seed: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let report = pmnet_sim::vopr::run(seed, &pmnet_sim::vopr::Options::default());
    println!("{:#?}", report.faults);
    println!(
        "completed {} converge {:?} hash {:08x}",
        report.requests_completed, report.virtual_time_to_converge, report.trace_hash
    );
}
