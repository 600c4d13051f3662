//! The `crius` command: serve the CRI (default), print or check the config, print the version.

use std::path::PathBuf;
use std::process::ExitCode;

use crius::cli::{Cli, Command, USAGE};
use crius::config::{Config, DEFAULT_CONFIG_PATH, DEFAULT_CONFIG_TOML};
use crius::cri::CriService;

fn main() -> ExitCode {
    let cli = match crius::cli::parse(
        std::env::args_os().skip(1),
        std::env::var_os("CRIUS_CONFIG"),
    ) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("crius: {e}\n\nUsage: crius [OPTIONS] [COMMAND]; `crius --help` says more");
            return ExitCode::from(2);
        }
    };
    run(cli)
}

fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Help => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("crius {}", env!("CARGO_PKG_VERSION"));
            println!("CRI API: v1, v1alpha2");
            ExitCode::SUCCESS
        }
        Command::ConfigDefault => {
            print!("{DEFAULT_CONFIG_TOML}");
            ExitCode::SUCCESS
        }
        Command::ConfigCheck => {
            let path = cli
                .config
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
            match Config::load(&path) {
                Ok(_) => {
                    println!("{}: OK", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("crius: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::ConfigMigrate { from, hosts_dir } => {
            let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
            match crius::migrate::run(&from, hosts_dir.as_deref(), &mut out, &mut err) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("crius: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Check => check(cli.config),
        Command::Metrics => {
            print!("{}", crius::metrics::describe());
            ExitCode::SUCCESS
        }
        Command::Serve => serve(cli.config, cli.log_level),
    }
}

/// `crius check`: one line per check, non-zero exit when one fails.
fn check(config_path: Option<PathBuf>) -> ExitCode {
    let config = match Config::load_or_default(config_path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            println!("FAIL config: {e} -> fix the file (crius config check names the key)");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("crius: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(crius::check::run(&config));
    print!("{}", report.render());
    if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn serve(config_path: Option<PathBuf>, log_level: Option<String>) -> ExitCode {
    let config = match Config::load_or_default(config_path.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("crius: {e}");
            return ExitCode::from(2);
        }
    };
    crius::logging::init(
        log_level.as_deref().unwrap_or(&config.log.level),
        config.log.format,
    );
    crius::server::raise_open_file_limit();
    crius::heap::limit_retention();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(worker_threads())
        .thread_name("crius")
        // Deep async call chains (a CreateContainer under a client deadline) need more than
        // tokio's 2 MiB in debug builds; untouched stack costs no memory.
        .thread_stack_size(8 * 1024 * 1024)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("crius: failed to start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The start-up and the serving futures go to the heap: held by value, their state (tens
    // of KiB) and its moves stayed in the main thread's stack, resident for good.
    let code = runtime.block_on(Box::pin(async {
        tracing::info!(version = env!("CARGO_PKG_VERSION"), "crius starting");
        tokio::spawn(crius::heap::release_when_quiet(
            crius::heap::QUIET,
            crius::heap::MAX_RELEASE_DELAY,
        ));
        let service = match Box::pin(CriService::new(config)).await {
            Ok(service) => service,
            Err(e) => {
                tracing::error!("failed to start: {e}");
                return ExitCode::FAILURE;
            }
        };
        match Box::pin(service.run(stop_signal())).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!("crius stopped because of a failure: {e}");
                ExitCode::FAILURE
            }
        }
    }));
    // Abandoned tasks (beyond the shutdown grace) must not hold the exit.
    runtime.shutdown_background();
    code
}

/// One worker per core, at most four: crius's calls wait on containerd, runc and CNI
/// plugins, and on a big node more workers would only add stacks.
fn worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Resolves on the first SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; only a critical failure stops crius");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = int.recv() => tracing::info!("received SIGINT"),
    }
}
