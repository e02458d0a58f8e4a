//! The `hermes` command line: the imperative shell around the engine. Each
//! command lives in `src/cli/`, with its arguments and its `run`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
