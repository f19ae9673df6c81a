//! Testnet harness: starts real `echo-node` processes on loopback and runs named scenarios.
//! Scenarios arrive with the dissemination (issue 4) and scheduler (issue 7) work.

fn main() {
    eprintln!("testnet: no scenarios yet (they arrive with issues 4 and 7)");
    std::process::exit(2);
}
