//! `pg-downstream --backend mock|nccl [--world-size N]`: runs the crate's collectives on the backend named at run
//! time and prints what each rank read back; on NCCL without a GPU or libnccl it prints "not applicable: <why>" and
//! exits successfully.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use pg_downstream::{run, Choice, Ran};

const USAGE: &str = "usage: pg-downstream --backend mock|nccl [--world-size N]";

fn parse(args: &[String]) -> Result<(Choice, usize), String> {
    let (mut choice, mut world) = (Choice::Mock, 2);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = it.next().ok_or(format!("{arg} needs a value\n{USAGE}"))?;
        match arg.as_str() {
            "--backend" => choice = value.parse()?,
            "--world-size" => world = value.parse().map_err(|e| format!("--world-size {value}: {e}"))?,
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok((choice, world))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (choice, world) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(why) => {
            eprintln!("{why}");
            return ExitCode::from(2);
        }
    };
    match run(choice, world) {
        Ok(Ran::Ranks(seen)) => {
            for rank in seen {
                println!("rank {}: all_reduce sum {}, broadcast {}", rank.rank, rank.sum, rank.broadcast);
            }
            ExitCode::SUCCESS
        }
        Ok(Ran::NotApplicable(why)) => {
            println!("not applicable: {why}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("failed: {error}");
            ExitCode::FAILURE
        }
    }
}
