//! One module per subcommand.

mod admit;
mod demo;
mod doctor;
mod eval;
mod export;
mod inspect;
mod keygen;
pub(crate) mod run;
mod status;

use crate::cli::Command;

pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Keygen(args) => keygen::keygen(&args),
        Command::Admit(args) => admit::admit(&args),
        Command::Run(args) => run::run(args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Status(args) => status::status(&args),
        Command::Demo(args) => demo::demo(&args),
        Command::Doctor(args) => doctor::doctor(&args),
        Command::Export(args) => export::export(&args),
        Command::Eval(args) => eval::eval(&args),
    }
}
