//! The `wharf` command: run handlers on a broker, check a config, send a
//! test message.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;

mod check;
use wharf::Host;
use wharf::authoring::{self, ComponentizeOptions, InvokeInput, Language};
use wharf::broker::{ConnectOptions, SendOptions};
use wharf::registry::Registry;
use wharf_core::config::{Broker, Config, RegistrySettings, SaslMechanism};
use wharf_core::endpoint::Endpoint;
use wharf_core::grants::ReplyGrant;
use wharf_core::grants::{AddressPattern, Grants, HttpGrants, HttpPattern, Output, OutputLimits};
use wharf_core::message::Fields;
use wharf_core::oci::ModuleReference;

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

/// A message's AMQP fields beyond body and application properties.
#[derive(clap::Args)]
struct FieldArgs {
    /// `group-id`: the message group (Artemis, ActiveMQ Classic) and an
    /// ordered mount's key with `order_by = "group-id"`.
    #[arg(long)]
    group_id: Option<String>,
    /// `group-sequence` (`wharf send`: of the first message, counting up
    /// with each).
    #[arg(long)]
    group_sequence: Option<u32>,
    /// `reply-to-group-id`.
    #[arg(long)]
    reply_to_group_id: Option<String>,
    /// `header.priority`, 0 to 255 (brokers order by 0 to 9; 4 by default).
    #[arg(long)]
    priority: Option<u8>,
    /// Not durable (`header.durable` false): the broker may keep it in
    /// memory only.
    #[arg(long)]
    transient: bool,
    /// `creation-time`, milliseconds since the Unix epoch.
    #[arg(long)]
    creation_time: Option<i64>,
    /// `absolute-expiry-time`, milliseconds since the Unix epoch.
    #[arg(long)]
    absolute_expiry_time: Option<i64>,
    /// `to`: the address written on the message.
    #[arg(long)]
    to: Option<String>,
    /// `user-id`, as the bytes of this text (brokers may check it against
    /// the login).
    #[arg(long)]
    user_id: Option<String>,
    /// A message annotation, `key=value` (a string; AMQP wants keys that
    /// start with `x-`); repeatable.
    #[arg(long = "annotation", value_parser = parse_property)]
    annotations: Vec<(String, String)>,
}

impl FieldArgs {
    fn fields(&self) -> Fields {
        Fields {
            to: self.to.clone(),
            user_id: self.user_id.clone().map(String::into_bytes),
            group_id: self.group_id.clone(),
            group_sequence: self.group_sequence,
            reply_to_group_id: self.reply_to_group_id.clone(),
            creation_time: self.creation_time,
            absolute_expiry_time: self.absolute_expiry_time,
            priority: self.priority,
            durable: !self.transient,
            first_acquirer: false,
        }
    }
}

/// The mounts `wharf pause` and `wharf resume` act on, and the host.
#[derive(clap::Args)]
struct Switching {
    /// The running host's admin listener, e.g. http://127.0.0.1:9090.
    #[arg(long)]
    admin: String,
    /// The tenant.
    #[arg(long)]
    tenant: String,
    /// One mount of the tenant; every mount of it when left out.
    #[arg(long)]
    mount: Option<String>,
    /// The admin listener's token (`[admin] token`); set `WHARF_ADMIN_TOKEN`
    /// instead to keep it out of the process list.
    #[arg(long, env = "WHARF_ADMIN_TOKEN", hide_env_values = true)]
    token: String,
}

/// The broker `wharf send` and `wharf request` talk to.
#[derive(clap::Args)]
struct BrokerChoice {
    /// The broker, e.g. amqp://admin:admin@127.0.0.1:5672 (amqps:// trusts
    /// the platform's CAs).
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    url: Option<String>,
    /// Connect as this config file's `[broker]` does (TLS, SASL, secrets).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// With `--config`: the broker of this tenant instead of the default.
    #[arg(long, requires = "config")]
    tenant: Option<String>,
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
        /// Explain how each mount's retries, delays and outputs are carried
        /// out.
        #[arg(long, short)]
        verbose: bool,
        /// Also connect to each broker, log in and attach to every mount's
        /// address (consuming nothing), and report each.
        #[arg(long)]
        connect: bool,
    },
    /// Publish messages to an address and wait for the broker to accept
    /// each (handy to try a mount).
    Send {
        #[command(flatten)]
        broker: BrokerChoice,
        /// The address to publish to.
        #[arg(long)]
        address: String,
        /// An application property, `key=value` (a string); repeatable.
        #[arg(long = "property", short = 'p', value_parser = parse_property)]
        properties: Vec<(String, String)>,
        #[command(flatten)]
        fields: FieldArgs,
        /// One message per body.
        #[arg(required = true)]
        bodies: Vec<String>,
    },
    /// End a topic mount's durable subscription on the broker (its waiting
    /// messages go with it). Removing the mount from the config and
    /// reloading does the same; stopping wharf never does.
    Unsubscribe {
        /// The configuration file.
        #[arg(long, short, default_value = "wharf.toml")]
        config: PathBuf,
        /// The mount's tenant.
        #[arg(long)]
        tenant: String,
        /// The topic mount.
        #[arg(long)]
        mount: String,
    },
    /// Pause a running wharf's mount, or every mount of a tenant: its
    /// link's credit is withdrawn, handlers running finish, and deliveries
    /// already on their way go back to the broker unhandled.
    Pause(Switching),
    /// Resume a paused mount, or every mount of a tenant.
    Resume(Switching),
    /// Send one request with a `reply-to` and print the reply (to try a
    /// handler that replies).
    Request {
        #[command(flatten)]
        broker: BrokerChoice,
        /// The address to send the request to.
        #[arg(long)]
        address: String,
        /// The request's body.
        #[arg(long, default_value = "")]
        body: String,
        /// An application property, `key=value` (a string); repeatable.
        #[arg(long = "property", short = 'p', value_parser = parse_property)]
        properties: Vec<(String, String)>,
        /// Where the reply goes; by default a queue named after the request.
        #[arg(long)]
        reply_to: Option<String>,
        /// How long to wait for the reply.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Run one delivery through a handler component, without a broker, and
    /// print its outcome.
    Invoke {
        /// The handler component.
        #[arg(long, short)]
        module: PathBuf,
        /// The message body, as text.
        #[arg(long, default_value = "")]
        body: String,
        /// An application property, `key=value` (a string); repeatable.
        #[arg(long = "property", short = 'p', value_parser = parse_property)]
        properties: Vec<(String, String)>,
        /// The attempt number the handler sees.
        #[arg(long, default_value_t = 1)]
        attempt: u32,
        /// Grant `clocks` or `random` (as a mount's [grants] would); repeatable.
        #[arg(long = "grant", value_parser = ["clocks", "random"])]
        grants: Vec<String>,
        /// An environment variable the handler may read, `NAME=value`; repeatable.
        #[arg(long = "env", value_parser = parse_property)]
        env: Vec<(String, String)>,
        /// An address pattern the handler may send to (as `grants.send`);
        /// repeatable. Nothing is published: the outputs are printed.
        #[arg(long = "send")]
        send: Vec<String>,
        /// An origin the handler may call over HTTP (as `grants.http`, e.g.
        /// `http://127.0.0.1:8080`); repeatable. The calls are made.
        #[arg(long = "http", value_parser = HttpPattern::parse)]
        http: Vec<HttpPattern>,
        /// The delivery's `reply-to`; grants `reply`.
        #[arg(long)]
        reply_to: Option<String>,
        #[command(flatten)]
        fields: FieldArgs,
        /// `header.first-acquirer`.
        #[arg(long)]
        first_acquirer: bool,
    },
    /// Print the KEDA `ScaledObject` that scales a Deployment of this
    /// config on its mounts' backlog: `wharf kube scaledobject --broker
    /// rabbitmq | kubectl apply -f -` (JSON, which kubectl reads as YAML).
    Kube {
        #[command(subcommand)]
        object: KubeObject,
    },
    /// Push a handler component to an OCI registry, for mounts whose
    /// `module` is `oci://…`: `wharf push handler.wasm
    /// oci://registry.example/team/orders:v1`. Prints the reference by
    /// digest.
    Push {
        /// The component.
        module: PathBuf,
        /// Where: `oci://REGISTRY/REPOSITORY:TAG`.
        reference: String,
        /// A Docker `config.json` with the registry's credentials.
        #[arg(long)]
        credentials: Option<PathBuf>,
        /// Speak plain HTTP to the registry (a local one).
        #[arg(long)]
        plain_http: bool,
    },
    /// Start a handler project: `wharf new --lang go my-handler`.
    New {
        /// The language: rust, js, python, go or c.
        #[arg(long, short)]
        lang: Language,
        /// The project folder to create; its name is the project's name.
        dir: PathBuf,
    },
    /// Turn a core wasm module (from clang, Go, ...) into a handler
    /// component: embeds the world and adapts WASI preview1 imports.
    Componentize {
        /// The core module.
        input: PathBuf,
        /// Where to write the component.
        #[arg(long, short)]
        output: PathBuf,
        /// Allocate through `memory.grow` while the module starts (Go needs it).
        #[arg(long)]
        realloc_via_memory_grow: bool,
    },
}

/// What `wharf kube` makes.
#[derive(Subcommand)]
enum KubeObject {
    /// A `ScaledObject`: one trigger per queue a mount consumes on the
    /// host's broker, summed.
    Scaledobject {
        /// The configuration file.
        #[arg(long, short, default_value = "wharf.toml")]
        config: PathBuf,
        /// The broker, whose scaler reads the backlog.
        #[arg(long, value_enum)]
        broker: KedaBroker,
        /// Artemis: the web console's `host:port`, as the cluster reaches it.
        #[arg(long, required_if_eq("broker", "artemis"))]
        management_endpoint: Option<String>,
        /// Artemis: the broker's name (`<name>` in broker.xml).
        #[arg(long, required_if_eq("broker", "artemis"))]
        broker_name: Option<String>,
        /// The Deployment scaled.
        #[arg(long, default_value = "wharf")]
        deployment: String,
        /// The `TriggerAuthentication` with the management API's
        /// credentials (RabbitMQ: its `host`).
        #[arg(long, default_value = "wharf-broker-management")]
        authentication: String,
        /// Backlog per replica.
        #[arg(long, default_value_t = 200)]
        target: u32,
        /// Fewest replicas (also held when the management API does not
        /// answer).
        #[arg(long, default_value_t = 1)]
        min_replicas: u32,
        /// Most replicas.
        #[arg(long, default_value_t = 10)]
        max_replicas: u32,
    },
}

/// A broker KEDA has a scaler for.
#[derive(Clone, Copy, ValueEnum)]
enum KedaBroker {
    Artemis,
    Rabbitmq,
}

/// Publishes `module` as `reference` and prints the reference by digest.
async fn push(
    module: &std::path::Path,
    reference: &str,
    credentials: Option<PathBuf>,
    plain_http: bool,
) -> anyhow::Result<()> {
    let reference = ModuleReference::parse(reference).map_err(anyhow::Error::msg)?;
    let component =
        std::fs::read(module).with_context(|| format!("cannot read `{}`", module.display()))?;
    let settings = RegistrySettings {
        credentials,
        plain_http: if plain_http {
            vec![reference.registry.clone()]
        } else {
            Vec::new()
        },
        ..RegistrySettings::default()
    };
    let digest = Registry::new(&settings)
        .push(component, &reference)
        .await
        .with_context(|| format!("cannot push `{}` to {reference}", module.display()))?;
    println!(
        "{reference} is oci://{}/{}@{digest}",
        reference.registry, reference.repository
    );
    Ok(())
}

/// Prints the `ScaledObject`, and on stderr each mount left out and why.
fn scaled_object(object: KubeObject) -> anyhow::Result<()> {
    let KubeObject::Scaledobject {
        config,
        broker,
        management_endpoint,
        broker_name,
        deployment,
        authentication,
        target,
        min_replicas,
        max_replicas,
    } = object;
    let config = Config::load(&config)?;
    let scaler = match broker {
        KedaBroker::Artemis => wharf::kube::Scaler::Artemis {
            management_endpoint: management_endpoint.unwrap_or_default(),
            broker_name: broker_name.unwrap_or_default(),
        },
        KedaBroker::Rabbitmq => wharf::kube::Scaler::RabbitMq,
    };
    let options = wharf::kube::ScaleOptions {
        deployment,
        authentication,
        target,
        min_replicas,
        max_replicas,
    };
    let (object, left_out) = wharf::kube::scaled_object(&config, &scaler, &options);
    for why in &left_out {
        eprintln!("left out: {why}");
    }
    anyhow::ensure!(
        object["spec"]["triggers"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "no mount consumes a queue on the host's broker: nothing to scale on"
    );
    println!("{}", serde_json::to_string_pretty(&object)?);
    Ok(())
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{text}` is not key=value"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    init_logging(log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once: as a log line where logs are read by machines, else as
            // the command's last words.
            let message = wharf_core::words::chain(e.chain());
            match log_format {
                LogFormat::Json => tracing::error!("{message}"),
                LogFormat::Text => {
                    wharf::logging::flush();
                    eprintln!("error: {message}");
                }
            }
            ExitCode::FAILURE
        }
    };
    wharf::logging::flush();
    code
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("WHARF_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: a log written to a file or a
    // pipe carries no escape codes, and `NO_COLOR` turns colour off.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(wharf::logging::LogWriter::stderr());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run { config } => serve(Config::load(&config)?).await,
        Command::Check {
            config,
            verbose,
            connect,
        } => check::check(&config, verbose, connect).await,
        Command::Kube { object } => scaled_object(object),
        Command::Push {
            module,
            reference,
            credentials,
            plain_http,
        } => push(&module, &reference, credentials, plain_http).await,
        Command::Unsubscribe {
            config,
            tenant,
            mount,
        } => unsubscribe(&Config::load(&config)?, &tenant, &mount).await,
        Command::Pause(switching) => switch(switching, true).await,
        Command::Resume(switching) => switch(switching, false).await,
        Command::Send {
            broker,
            address,
            properties,
            fields,
            bodies,
        } => {
            let options = SendOptions {
                address,
                properties,
                fields: fields.fields(),
                annotations: fields.annotations,
                timeout: Duration::from_secs(30),
                ..send_options(broker, "send")?
            };
            wharf::broker::send(&options, &bodies)
                .await
                .context("send failed")
        }
        Command::Request {
            broker,
            address,
            body,
            properties,
            reply_to,
            timeout,
        } => {
            let options = SendOptions {
                address,
                properties,
                timeout,
                reply_to,
                ..send_options(broker, "request")?
            };
            let reply = wharf::broker::request(&options, &body)
                .await
                .context("request failed")?;
            println!("{}", String::from_utf8_lossy(&reply.body));
            Ok(())
        }
        Command::Invoke {
            module,
            body,
            properties,
            attempt,
            grants,
            env,
            send,
            http,
            reply_to,
            fields,
            first_acquirer,
        } => {
            let input = InvokeInput {
                fields: Fields {
                    first_acquirer,
                    ..fields.fields()
                },
                annotations: fields.annotations,
                body: body.into_bytes(),
                properties,
                attempt,
                grants: Grants {
                    clocks: grants.iter().any(|g| g == "clocks"),
                    random: grants.iter().any(|g| g == "random"),
                    env: env.into_iter().collect(),
                    output: Output::Log,
                    send: send.into_iter().map(AddressPattern::new).collect(),
                    reply: if reply_to.is_some() {
                        ReplyGrant::Any
                    } else {
                        ReplyGrant::Denied
                    },
                    outputs: OutputLimits::default(),
                    // On a developer's machine its own services are what a
                    // handler under development calls.
                    http: HttpGrants {
                        allowed: http,
                        admin: None,
                        allow_private_networks: true,
                    },
                },
                reply_to,
            };
            let (result, outputs) = authoring::invoke(&module, input).await?;
            match result {
                Ok(outcome) => {
                    println!("{}", describe(outcome));
                    if outcome == wharf::sandbox::Outcome::Ack {
                        for output in &outputs {
                            println!("{}", describe_output(output));
                        }
                    } else if !outputs.is_empty() {
                        println!("({} outputs discarded: only ack publishes)", outputs.len());
                    }
                    Ok(())
                }
                Err(failure) => {
                    anyhow::bail!("handler failed ({}): {failure}", failure.kind())
                }
            }
        }
        Command::New { lang, dir } => {
            authoring::scaffold(lang, &dir)?;
            println!(
                "created {lang} handler project `{}`; see its README.md",
                dir.display()
            );
            Ok(())
        }
        Command::Componentize {
            input,
            output,
            realloc_via_memory_grow,
        } => {
            let core = std::fs::read(&input)
                .with_context(|| format!("cannot read `{}`", input.display()))?;
            let options = ComponentizeOptions {
                realloc_via_memory_grow,
            };
            let component = authoring::componentize(&core, options)
                .with_context(|| format!("`{}`", input.display()))?;
            std::fs::write(&output, component)
                .with_context(|| format!("cannot write `{}`", output.display()))
        }
    }
}

/// How `wharf send` or `wharf request` (`command`) reaches the broker of
/// [`send_broker`], to be completed with what to send.
/// `wharf unsubscribe`: ends the durable subscription of one topic mount.
/// Pauses or resumes mounts through a running host's admin listener.
async fn switch(target: Switching, paused: bool) -> anyhow::Result<()> {
    let Switching {
        admin,
        tenant,
        mount,
        token,
    } = target;
    // Names as the config allows them: nothing else can be in a path.
    for name in std::iter::once(&tenant).chain(&mount) {
        anyhow::ensure!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "`{name}` is not a tenant or mount name: those use only letters, digits, `-`, `_` and `.`"
        );
    }
    let action = if paused { "pause" } else { "resume" };
    let path = match &mount {
        Some(mount) => format!("/tenants/{tenant}/mounts/{mount}/{action}"),
        None => format!("/tenants/{tenant}/{action}"),
    };
    let (status, body) = wharf::admin::client::request(
        &admin,
        "POST",
        &path,
        Some(&token),
        std::time::Duration::from_secs(10),
    )
    .await?;
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    if status != 200 {
        let why = answer["error"].as_str().unwrap_or(body.trim());
        anyhow::bail!("{admin} answered {status}: {why}");
    }
    let mounts: Vec<&str> = answer["mounts"]
        .as_array()
        .map(|mounts| {
            mounts
                .iter()
                .filter_map(serde_json::Value::as_str)
                .collect()
        })
        .unwrap_or_default();
    println!(
        "{} in tenant `{tenant}`: {}",
        if paused { "paused" } else { "resumed" },
        mounts.join(", ")
    );
    Ok(())
}

async fn unsubscribe(config: &Config, tenant: &str, mount: &str) -> anyhow::Result<()> {
    let (owner, found) = config
        .mounts()
        .find(|(t, m)| t.name == tenant && m.name == mount)
        .with_context(|| {
            format!(
                "{}: no mount `{mount}` in tenant `{tenant}`",
                config.path.display()
            )
        })?;
    let subscription = found.subscription.as_ref().with_context(|| {
        format!("tenant `{tenant}`, mount `{mount}` is not a topic mount (`node = \"topic\"`): it has no subscription")
    })?;
    anyhow::ensure!(
        subscription.kind != wharf_core::config::SubscriptionKind::Volatile,
        "tenant `{tenant}`, mount `{mount}` has a volatile subscription: it ends with its link, there is nothing to end"
    );
    let broker = owner.broker.as_ref().unwrap_or(&config.broker);
    let url = broker.urls.first().context("the broker names no URL")?;
    let mut connect = ConnectOptions::of(broker);
    connect.container_id = format!("wharf-unsubscribe-{}", std::process::id());
    wharf::broker::end_subscription(
        &Endpoint::parse(url).map_err(anyhow::Error::msg)?,
        &connect,
        &found.address,
        &subscription.name,
        subscription.kind,
        Duration::from_secs(30),
    )
    .await
    .with_context(|| format!("cannot end subscription `{}`", subscription.name))?;
    println!(
        "ended subscription `{}` of {tenant}/{mount} on `{}` (the broker deletes it once no other link consumes from it)",
        subscription.name, found.address
    );
    Ok(())
}

fn send_options(choice: BrokerChoice, command: &str) -> anyhow::Result<SendOptions> {
    let broker = send_broker(choice)?;
    let url = broker.urls.first().context("the broker names no URL")?;
    let mut connect = ConnectOptions::of(&broker);
    connect.container_id = format!("wharf-{command}-{}", std::process::id());
    Ok(SendOptions {
        endpoint: Endpoint::parse(url).map_err(anyhow::Error::msg)?,
        connect,
        address: String::new(),
        properties: Vec::new(),
        fields: Fields {
            durable: true,
            ..Fields::default()
        },
        annotations: Vec::new(),
        timeout: Duration::from_secs(30),
        reply_to: None,
    })
}

/// The broker `wharf send` publishes to: a URL, or a config's broker (a
/// tenant's own when named).
fn send_broker(choice: BrokerChoice) -> anyhow::Result<Broker> {
    let BrokerChoice {
        url,
        config,
        tenant,
    } = choice;
    let Some(path) = config else {
        let url = url.context("give --url or --config")?;
        let broker = Broker::at(&url);
        let endpoint = Endpoint::parse(&url).map_err(anyhow::Error::msg)?;
        if broker.credentials.mechanism == SaslMechanism::Plain
            && endpoint.in_clear_across_network()
        {
            anyhow::bail!(
                "`{endpoint}`: the password would cross the network without TLS; use amqps://, or --config with `allow_plain_without_tls = true`"
            );
        }
        return Ok(broker);
    };
    let config = Config::load(&path)?;
    match tenant {
        None => Ok(config.broker),
        Some(name) => {
            let tenant = config
                .tenants
                .iter()
                .find(|t| t.name == name)
                .with_context(|| format!("`{}` has no tenant `{name}`", path.display()))?;
            Ok(tenant.broker.clone().unwrap_or(config.broker))
        }
    }
}

/// Time to close connections beyond the shutdown grace period.
const CLOSE_ALLOWANCE: Duration = Duration::from_secs(5);

/// An outcome as `wharf invoke` prints it.
fn describe(outcome: wharf::sandbox::Outcome) -> String {
    use wharf::sandbox::Outcome;
    match outcome {
        Outcome::Ack => "ack".to_owned(),
        Outcome::Retry => "retry".to_owned(),
        Outcome::RetryAfter(ms) => format!("retry-after {ms}ms"),
        Outcome::Drop => "drop".to_owned(),
    }
}

/// One output as `wharf invoke` prints it: where it goes, its ids, and its
/// body as text, all escaped (the module chose them) and the body cut at
/// [`SHOWN_BODY_BYTES`].
fn describe_output(output: &wharf::sandbox::Outgoing) -> String {
    use wharf_core::message::PropertyValue as Value;
    use wharf_core::text::{shown, shown_up_to};
    let message = &output.message;
    let mut line = format!("output to `{}`", output.address);
    if let Some(id) = &message.correlation_id {
        line += &format!(" correlation-id={}", shown(id));
    }
    if let Some(subject) = &message.subject {
        line += &format!(" subject={}", shown(subject));
    }
    if let Some(group) = &message.group_id {
        line += &format!(" group-id={}", shown(group));
    }
    if let Some(group) = &message.reply_to_group_id {
        line += &format!(" reply-to-group-id={}", shown(group));
    }
    let numbers = [
        ("group-sequence", message.group_sequence.map(i64::from)),
        ("priority", message.priority.map(i64::from)),
        ("creation-time", message.creation_time),
        ("absolute-expiry-time", message.absolute_expiry_time),
    ];
    for (name, number) in numbers {
        if let Some(number) = number {
            line += &format!(" {name}={number}");
        }
    }
    for property in &message.properties {
        let value = match &property.value {
            Value::String(s) | Value::Other(s) => shown(s).to_string(),
            Value::Int(n) | Value::Timestamp(n) => n.to_string(),
            Value::Uint(n) => n.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Boolean(b) => b.to_string(),
            Value::Bytes(b) => format!("{} bytes", b.len()),
            Value::Null => "null".to_owned(),
        };
        line += &format!(" {}={value}", shown(&property.key));
    }
    let body = String::from_utf8_lossy(&message.body);
    line += &format!(": {}", shown_up_to(&body, SHOWN_BODY_BYTES));
    line
}

/// The most of an output's body `wharf invoke` prints.
const SHOWN_BODY_BYTES: usize = 64 * 1024;

async fn serve(config: Config) -> anyhow::Result<()> {
    let grace = config.host.shutdown_grace;
    let host = Host::load(config).await?;
    let loaded = host.modules_loaded();
    tracing::info!(
        compiled = loaded.compiled,
        from_cache = loaded.from_cache,
        elapsed_ms = u64::try_from(loaded.took.as_millis()).unwrap_or(u64::MAX),
        "modules ready"
    );
    let host = host.start().await?;
    // Listening before saying so: a SIGHUP sent on reading "running" must
    // not meet the default action, which ends the process. Listening from
    // the start also means a signal during a reload is not missed.
    let listen = |kind| signal(kind).context("cannot listen for signals");
    let mut interrupts = listen(SignalKind::interrupt())?;
    let mut terms = listen(SignalKind::terminate())?;
    let mut hangups = listen(SignalKind::hangup())?;
    tracing::info!("running; stop with Ctrl-C or SIGTERM, reload the config with SIGHUP");
    loop {
        tokio::select! {
            _ = interrupts.recv() => {
                tracing::info!("SIGINT: stopping");
                break;
            }
            _ = terms.recv() => {
                tracing::info!("SIGTERM: stopping");
                break;
            }
            _ = hangups.recv() => {
                tracing::info!("SIGHUP: reloading the config");
                // A reload waits on brokers; a stop signal meanwhile is
                // acted on at once.
                tokio::select! {
                    _ = host.reload() => {}
                    _ = interrupts.recv() => { tracing::info!("SIGINT: stopping"); break; }
                    _ = terms.recv() => { tracing::info!("SIGTERM: stopping"); break; }
                }
            }
        }
    }
    // Whatever a broker that does not answer holds up stays on the broker,
    // unsettled: the stop never waits past the grace period and the time
    // to close the connections.
    let limit = grace + CLOSE_ALLOWANCE;
    if tokio::time::timeout(limit, host.shutdown()).await.is_err() {
        tracing::warn!(
            ?limit,
            "stopping took too long; exiting, unsettled deliveries stay on the broker"
        );
    }
    tracing::info!("stopped");
    Ok(())
}

/// The command-line reference, `docs/reference/cli.md`, made from the
/// commands' own definitions so that it cannot drift from them.
#[cfg(test)]
fn cli_reference() -> String {
    use clap::CommandFactory as _;
    let cli = Cli::command();
    let mut text = String::from(
        "# Command-line reference\n\n\
         Made from `wharf`'s own definitions; a test fails when they differ \
         (`WHARF_UPDATE_DOCS=1 cargo test -p wharf-host --bin wharf` rewrites it).\n\n",
    );
    text += "Log lines go to stderr, their level filter in `WHARF_LOG`. Every command takes:\n";
    arguments_of(&cli, |arg| arg.is_global_set(), &mut text);
    for command in cli.get_subcommands() {
        reference_of(command, "wharf", &mut text);
    }
    text
}

/// `command`'s section of the reference, and its subcommands'.
#[cfg(test)]
fn reference_of(command: &clap::Command, parent: &str, text: &mut String) {
    let name = format!("{parent} {}", command.get_name());
    let one_line = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let about = command
        .get_long_about()
        .or(command.get_about())
        .map(|about| one_line(about.to_string()))
        .unwrap_or_default();
    *text += &format!("\n## `{name}`\n\n{about}\n");
    arguments_of(command, |arg| !arg.is_global_set(), text);
    for sub in command.get_subcommands() {
        reference_of(sub, &name, text);
    }
}

/// The table of `command`'s arguments that `wanted` picks, if any.
#[cfg(test)]
fn arguments_of(command: &clap::Command, wanted: impl Fn(&clap::Arg) -> bool, text: &mut String) {
    let one_line = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let arguments: Vec<_> = command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set() && wanted(arg))
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .collect();
    if !arguments.is_empty() {
        *text += "\n| argument | default | what it is |\n|---|---|---|\n";
    }
    for arg in arguments {
        let shown = match (arg.get_long(), arg.get_short()) {
            (Some(long), Some(short)) => format!("`-{short}`, `--{long}`"),
            (Some(long), None) => format!("`--{long}`"),
            _ => format!("`{}`", arg.get_id().as_str().to_uppercase()),
        };
        let default = arg
            .get_default_values()
            .iter()
            .map(|value| format!("`{}`", value.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(", ");
        let help = arg
            .get_long_help()
            .or(arg.get_help())
            .map(|help| one_line(help.to_string()).replace('|', "\\|"))
            .unwrap_or_default();
        *text += &format!("| {shown} | {default} | {help} |\n");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_command_line_reference_is_up_to_date() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/cli.md");
        let made = super::cli_reference();
        if std::env::var_os("WHARF_UPDATE_DOCS").is_some() {
            std::fs::create_dir_all(std::path::Path::new(path).parent().expect("a folder"))
                .expect("docs/reference");
            std::fs::write(path, &made).expect("docs/reference/cli.md written");
        }
        let kept = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            kept == made,
            "docs/reference/cli.md differs from the commands: rewrite it with WHARF_UPDATE_DOCS=1 cargo test -p wharf-host --bin wharf"
        );
    }
}
