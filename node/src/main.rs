//! `echo-node`: one binary, learner or rollout worker of an echo-swarm.
//!
//! This file only parses the command line, sets up logging and dispatches; each subcommand
//! lives in `commands/`.

use std::process::ExitCode;

use clap::Parser;
use echo_node::{cli, commands, logging};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    logging::init(cli.verbose, cli.quiet);
    match commands::dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
