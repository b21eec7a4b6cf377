//! The `wharf` command: run handlers on a broker, check a config, send a
//! test message.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;
use wharf::config::Config;
use wharf::{Host, HostError};

#[derive(Parser)]
#[command(
    name = "wharf",
    version,
    about = "Runs WebAssembly handlers on AMQP 1.0 messages"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Connect to the broker and run every mount until SIGINT or SIGTERM.
    Run {
        /// The configuration file.
        #[arg(long, short, default_value = "wharf.toml")]
        config: PathBuf,
    },
    /// Validate the configuration and compile every module, without
    /// touching the broker.
    Check {
        /// The configuration file.
        #[arg(long, short, default_value = "wharf.toml")]
        config: PathBuf,
    },
    /// Publish messages to an address and wait for the broker to accept
    /// each (handy to try a mount).
    Send {
        /// The broker, e.g. amqp://admin:admin@127.0.0.1:5672.
        #[arg(long)]
        url: String,
        /// The address to publish to.
        #[arg(long)]
        address: String,
        /// An application property, `key=value` (a string); repeatable.
        #[arg(long = "property", short = 'p', value_parser = parse_property)]
        properties: Vec<(String, String)>,
        /// One message per body.
        #[arg(required = true)]
        bodies: Vec<String>,
    },
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{text}` is not key=value"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("WHARF_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config } => serve(Config::load(&config)?).await,
        Command::Check { config } => {
            let loaded = Config::load(&config)?;
            let mounts = loaded.mounts().count();
            let tenants = loaded.tenants.len();
            Host::load(loaded)?;
            println!(
                "{}: ok ({tenants} tenant(s), {mounts} mount(s), every module is a valid handler)",
                config.display()
            );
            Ok(())
        }
        Command::Send {
            url,
            address,
            properties,
            bodies,
        } => wharf::broker::send(&url, &address, &properties, &bodies)
            .await
            .context("send failed"),
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let mut host = Host::load(config)?.start().await?;
    tracing::info!("running; stop with Ctrl-C or SIGTERM");
    let failed: Option<HostError> = tokio::select! {
        signal = stop_signal() => {
            tracing::info!("{signal}: stopping");
            None
        }
        error = host.failed() => Some(error),
    };
    let stopped = host.shutdown().await;
    if let Some(error) = failed {
        return Err(error.into());
    }
    stopped?;
    tracing::info!("stopped");
    Ok(())
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}
