use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    let dir = std::env::temp_dir().join(format!("wharf-config-test-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("handlers")).expect("temp dir");
    std::fs::write(dir.join("handlers/orders.wasm"), b"").expect("module file");
    Config::parse(text, &dir.join("wharf.toml"))
}

fn error(text: &str) -> String {
    parse(text)
        .expect_err("config should be refused")
        .to_string()
}

const GOOD: &str = r#"
[broker]
url = "amqp://admin:admin@127.0.0.1:5672"

[[tenant]]
name = "acme"

[[tenant.mount]]
name = "orders"
module = "handlers/orders.wasm"
address = "orders"
node = "queue"
settle = "at-least-once"
max_attempts = 5
dead_letter = "orders.dlq"
credit = 64
concurrency = 8
timeout = "5s"
memory = "64MiB"
"#;

#[test]
fn full_example_parses() {
    let config = parse(GOOD).expect("valid config");
    let (tenant, mount) = config.mounts().next().expect("one mount");
    assert_eq!(tenant.name, "acme");
    assert_eq!(mount.name, "orders");
    assert!(mount.module.ends_with("handlers/orders.wasm"));
    assert_eq!(mount.settle, Settle::AtLeastOnce);
    assert_eq!(mount.node, Some(Node::Queue));
    assert_eq!(mount.max_attempts, Some(5));
    assert_eq!(mount.dead_letter.as_deref(), Some("orders.dlq"));
    assert_eq!(mount.timeout, Duration::from_secs(5));
    assert_eq!(mount.memory, 64 << 20);
    assert_eq!(config.host.shutdown_grace, Duration::from_secs(30));
}

#[test]
fn defaults_apply() {
    let config = parse(
        r#"
[broker]
url = "amqp://127.0.0.1"
[[tenant]]
name = "a"
[[tenant.mount]]
name = "m"
module = "handlers/orders.wasm"
address = "q"
"#,
    )
    .expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(mount.settle, Settle::AtLeastOnce);
    assert_eq!(mount.max_attempts, None);
    assert_eq!(mount.credit, Mount::DEFAULT_CREDIT);
    assert_eq!(mount.concurrency, Mount::DEFAULT_CONCURRENCY);
    assert_eq!(mount.timeout, Mount::DEFAULT_TIMEOUT);
    assert_eq!(mount.memory, Mount::DEFAULT_MEMORY);
}

#[test]
fn unknown_key_names_key_and_line() {
    let e = error(&GOOD.replace("credit = 64", "credits = 64"));
    assert!(e.contains("wharf.toml"), "{e}");
    assert!(e.contains("line 16"), "{e}");
    assert!(e.contains("unknown field `credits`"), "{e}");
}

#[test]
fn bad_duration_names_value_and_line() {
    let e = error(&GOOD.replace(r#"timeout = "5s""#, r#"timeout = "5 parsecs""#));
    assert!(e.contains("line 18"), "{e}");
    assert!(e.contains("`5 parsecs` is not a duration"), "{e}");
}

#[test]
fn bad_size_is_refused() {
    let e = error(&GOOD.replace(r#"memory = "64MiB""#, r#"memory = "lots""#));
    assert!(e.contains("`lots` is not a size"), "{e}");
}

#[test]
fn bad_node_is_refused() {
    let e = error(&GOOD.replace(r#"node = "queue""#, r#"node = "exchange""#));
    assert!(e.contains("unknown variant `exchange`"), "{e}");
}

#[test]
fn bad_settle_mode_is_refused() {
    let e = error(&GOOD.replace("at-least-once", "exactly-once"));
    assert!(e.contains("exactly-once"), "{e}");
}

#[test]
fn missing_module_names_tenant_mount_and_path() {
    let e = error(&GOOD.replace("handlers/orders.wasm", "handlers/missing.wasm"));
    assert!(e.contains("line 10"), "{e}");
    assert!(e.contains("tenant `acme`, mount `orders`"), "{e}");
    assert!(e.contains("handlers/missing.wasm` does not exist"), "{e}");
}

#[test]
fn modules_from_registries_are_kept_under_the_module_cache() {
    let oci = GOOD.replace("handlers/orders.wasm", "oci://ghcr.io/acme/orders:v1");
    let e = error(&oci);
    assert!(e.contains("line 10"), "{e}");
    assert!(e.contains("needs `[host] module_cache`"), "{e}");

    let cached = oci.replace(
        "[[tenant]]",
        "[host]\nmodule_cache = \"cache\"\n[host.registry]\ncredentials = \"pull.json\"\npoll = \"5m\"\nplain_http = [\"127.0.0.1:5000\"]\n[[tenant]]",
    );
    let config = parse(&cached).expect("parses");
    let mount = &config.tenants[0].mounts[0];
    let reference = mount.pulled_from.as_ref().expect("pulled");
    assert_eq!(reference.to_string(), "oci://ghcr.io/acme/orders:v1");
    assert!(
        mount.module.starts_with(
            config
                .host
                .module_cache
                .as_ref()
                .expect("valid")
                .join("oci")
        )
    );
    let registry = &config.host.registry;
    assert_eq!(registry.poll, Duration::from_secs(300));
    assert!(
        registry
            .credentials
            .as_ref()
            .expect("valid")
            .ends_with("pull.json")
    );
    assert!(registry.credentials.as_ref().expect("valid").is_absolute());
    assert_eq!(registry.plain_http, ["127.0.0.1:5000"]);

    let e = error(&cached.replace("acme/orders:v1", "Acme/orders:v1"));
    assert!(
        e.contains("line 16") && e.contains("repository `Acme/orders`"),
        "{e}"
    );
}

#[test]
fn duplicate_tenant_is_refused() {
    let text = format!("{GOOD}\n[[tenant]]\nname = \"acme\"\n");
    let e = error(&text);
    assert!(e.contains("duplicate tenant name `acme`"), "{e}");
    assert!(e.contains("line 22"), "{e}");
}

#[test]
fn duplicate_mount_is_refused() {
    let text = format!(
        "{GOOD}\n[[tenant.mount]]\nname = \"orders\"\nmodule = \"handlers/orders.wasm\"\naddress = \"x\"\n"
    );
    let e = error(&text);
    assert!(
        e.contains("tenant `acme`: duplicate mount name `orders`"),
        "{e}"
    );
}

#[test]
fn dead_letter_to_own_address_is_refused() {
    let e = error(&GOOD.replace(r#"dead_letter = "orders.dlq""#, r#"dead_letter = "orders""#));
    assert!(e.contains("`dead_letter` must be"), "{e}");
}

#[test]
fn zero_limits_are_refused() {
    for key in ["max_attempts = 5", "credit = 64", "concurrency = 8"] {
        let (name, _) = key.split_once(" = ").expect("key");
        let e = error(&GOOD.replace(key, &format!("{name} = 0")));
        assert!(e.contains(&format!("`{name}` must be at least 1")), "{e}");
    }
}

#[test]
fn bad_names_are_refused() {
    let e = error(&GOOD.replace(r#"name = "orders""#, r#"name = "or ders""#));
    assert!(e.contains("mount name `or ders`"), "{e}");
}

#[test]
fn missing_broker_is_refused() {
    let e = error("[[tenant]]\nname = \"a\"\n");
    assert!(e.contains("missing field `broker`"), "{e}");
}

#[test]
fn grants_and_instance_reuse_parse() {
    let config = parse(&format!(
        "{GOOD}instance = \"reuse\"\ninstance_max_uses = 50\ninstance_max_idle = \"5s\"\n\
         [tenant.mount.grants]\nclocks = true\nenv = {{ REGION = \"eu\" }}\noutput = \"drop\"\n"
    ))
    .expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(
        mount.instance,
        InstancePolicy::Reuse {
            max_uses: 50,
            max_idle: Duration::from_secs(5)
        }
    );
    assert!(mount.grants.clocks);
    assert!(!mount.grants.random);
    assert_eq!(
        mount.grants.env.get("REGION").map(String::as_str),
        Some("eu")
    );
    assert_eq!(mount.grants.output, Output::Drop);
}

#[test]
fn nothing_is_granted_and_instances_are_fresh_by_default() {
    let config = parse(GOOD).expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(mount.grants, Grants::default());
    assert_eq!(mount.instance, InstancePolicy::PerDelivery);
}

#[test]
fn reuse_settings_without_reuse_are_refused() {
    let e = error(&format!("{GOOD}instance_max_uses = 5\n"));
    assert!(
        e.contains("`instance_max_uses` only applies with `instance = \"reuse\"`"),
        "{e}"
    );
    let line = GOOD.matches('\n').count() + 1;
    assert!(e.contains(&format!("line {line}")), "{e}");
}

#[test]
fn unknown_grants_are_refused() {
    let e = error(&format!("{GOOD}[tenant.mount.grants]\nnetwork = true\n"));
    assert!(e.contains("unknown field `network`"), "{e}");
}

const TWO_TENANTS: &str = r#"
[broker]
url = "amqp://127.0.0.1"
[admin]
listen = "127.0.0.1:9090"

[[tenant]]
name = "a"
max_running = 4
max_memory = "128MiB"
max_pending_copies = 100
max_cpu = "500m"
max_rate = 2000
max_http_connections = 8
log_rate = "1KiB"
log_level = "info"
[[tenant.mount]]
name = "m"
module = "handlers/orders.wasm"
address = "a.q"
dead_letter = "a.dlq"

[[tenant]]
name = "b"
[tenant.broker]
url = "amqp://other:5672"
container_id = "b"
[[tenant.mount]]
name = "m"
module = "handlers/orders.wasm"
address = "b.q"
"#;

#[test]
fn tenants_have_budgets_brokers_and_the_host_an_admin_listener() {
    let config = parse(TWO_TENANTS).expect("valid config");
    assert_eq!(
        config.admin.map(|a| a.listen.to_string()).as_deref(),
        Some("127.0.0.1:9090")
    );
    let a = &config.tenants[0];
    assert_eq!(
        a.budget,
        TenantBudget {
            max_running: Some(4),
            max_memory: Some(128 << 20),
            max_pending_copies: Some(100),
            max_buffered: TenantBudget::DEFAULT_MAX_BUFFERED,
            max_rate: Some(2000),
            max_cpu: Some(500),
            max_http_connections: 8,
            log_rate: 1024,
            log_level: LogLevel::Info,
        }
    );
    assert_eq!(a.broker, None);
    let b = &config.tenants[1];
    assert_eq!(b.budget, TenantBudget::default());
    assert_eq!(
        b.broker.as_ref().map(|b| b.urls.as_slice()),
        Some(&["amqp://other:5672".to_owned()][..])
    );
    assert_eq!(b.mounts[0].name, "m");
}

#[test]
fn tenants_cannot_share_an_address_on_one_broker() {
    let e = error(
        &TWO_TENANTS
            .replace(
                "[tenant.broker]\nurl = \"amqp://other:5672\"\ncontainer_id = \"b\"\n",
                "",
            )
            .replace("address = \"b.q\"", "address = \"a.dlq\""),
    );
    assert!(
        e.contains("tenant `b`, mount `m`: address `a.dlq` already belongs to tenant `a`"),
        "{e}"
    );
    // On different brokers the same name is a different node.
    parse(&TWO_TENANTS.replace("address = \"b.q\"", "address = \"a.q\"")).expect("valid config");
}

#[test]
fn tenants_cannot_share_an_address_under_another_spelling() {
    let one_broker = TWO_TENANTS.replace(
        "[tenant.broker]\nurl = \"amqp://other:5672\"\ncontainer_id = \"b\"\n",
        "",
    );
    for spelling in ["/queues/a%2Eq", "queue://a.q", "a.q::x"] {
        let e =
            error(&one_broker.replace("address = \"b.q\"", &format!("address = \"{spelling}\"")));
        assert!(
            e.contains("already belongs to tenant `a`"),
            "{spelling}: {e}"
        );
    }
    // Two queues spelt alike are still two queues.
    let alike = one_broker
        .replace("address = \"a.q\"", "address = \"/queue/a.q\"")
        .replace("dead_letter = \"a.dlq\"", "dead_letter = \"/queue/a.dlq\"")
        .replace("address = \"b.q\"", "address = \"/queue/b.q\"");
    parse(&alike).expect("/queue/a.q and /queue/b.q are two queues");
}

#[test]
fn an_address_longer_than_wharf_attaches_to_is_refused() {
    let long = "q".repeat(crate::address::MAX_ADDRESS_BYTES + 1);
    let e = error(&TWO_TENANTS.replace("address = \"b.q\"", &format!("address = \"{long}\"")));
    assert!(
        e.contains("tenant `b`, mount `m`: address `qqqq") && e.contains("over the limit of 1024"),
        "{e}"
    );
}

#[test]
fn a_tenants_cpu_is_cores_or_thousandths_of_one() {
    let cpu = |value: &str| {
        parse(&TWO_TENANTS.replace("max_cpu = \"500m\"", &format!("max_cpu = {value}")))
            .map(|config| config.tenants[0].budget.max_cpu)
    };
    assert_eq!(cpu("1").ok(), Some(Some(1000)));
    assert_eq!(cpu("0.25").ok(), Some(Some(250)));
    assert_eq!(cpu("\"1.5\"").ok(), Some(Some(1500)));
    let e = cpu("0").expect_err("no CPU at all").to_string();
    assert!(
        e.contains("tenant `a`: `max_cpu` must be at least \"1m\""),
        "{e}"
    );
    let e = cpu("\"lots\"").expect_err("not cores").to_string();
    assert!(e.contains("`lots` is not a number of cores"), "{e}");
    assert!(e.contains("line 12"), "{e}");
}

#[test]
fn a_mount_larger_than_its_tenants_memory_budget_is_refused() {
    let e = error(&TWO_TENANTS.replace("dead_letter = \"a.dlq\"", "memory = \"256MiB\""));
    assert!(e.contains("larger than the tenant's `max_memory`"), "{e}");
    // The default `memory` counts too.
    let e = error(&TWO_TENANTS.replace("max_memory = \"128MiB\"", "max_memory = \"32MiB\""));
    assert!(e.contains("`memory` (67108864 bytes) is larger"), "{e}");
}

#[test]
fn a_tenant_connection_gets_a_container_id_of_its_own() {
    let config = parse(&TWO_TENANTS.replace("container_id = \"b\"\n", "")).expect("valid config");
    let own = config.tenants[1].broker.as_ref().expect("own broker");
    assert_eq!(
        own.container_id,
        format!("{}-b", config.broker.container_id)
    );
}

#[test]
fn a_broker_may_be_a_cluster_with_its_timeouts_and_backoff() {
    let config = parse(
        r#"
[broker]
url = ["amqp://u:p@node-a:5672", "amqp://u:p@node-b:5672"]
allow_plain_without_tls = true
connect_timeout = "3s"
idle_timeout = "2s"
attach_timeout = "4s"
publish_timeout = "5s"
reconnect_initial = "50ms"
reconnect_max = "10s"
"#,
    )
    .expect("valid config");
    let broker = &config.broker;
    assert_eq!(broker.urls.len(), 2);
    assert_eq!(broker.connect_timeout, Duration::from_secs(3));
    assert_eq!(broker.idle_timeout, Duration::from_secs(2));
    assert_eq!(broker.attach_timeout, Duration::from_secs(4));
    assert_eq!(broker.publish_timeout, Duration::from_secs(5));
    assert_eq!(broker.reconnect.initial, Duration::from_millis(50));
    assert_eq!(broker.reconnect.max, Duration::from_secs(10));
    assert_eq!(
        broker.display(),
        "amqp://u:***@node-a:5672, amqp://u:***@node-b:5672"
    );
    assert!(
        !format!("{config:?}").contains("u:p@"),
        "Debug hides passwords"
    );
}

#[test]
fn a_bad_broker_url_is_refused_without_showing_its_password() {
    let e = error("[broker]\nurl = \"http://user:hunter2@host\"\n");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("`http`"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let e = error("[broker]\nurl = []\n");
    assert!(e.contains("lists no broker"), "{e}");
    let e = error("[broker]\nurl = \"amqp://h\"\nidle_timeout = \"0s\"\n");
    assert!(e.contains("`idle_timeout` must be longer than zero"), "{e}");
}

#[test]
fn mounts_choose_their_message_size_retry_delay_and_outputs_paths() {
    let config = parse(&format!(
        "{GOOD}max_message_size = \"1MiB\"\nretry = \"copy\"\ndelay = \"held\"\nretry_after_original = \"accepted\"\noutputs = \"confirm\"\n"
    ))
    .expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(mount.max_message_size, 1 << 20);
    assert_eq!(mount.retry, Some(RetryChoice::Copy));
    assert_eq!(mount.delay, Some(DelayChoice::Held));
    assert_eq!(
        mount.retry_after_original,
        Some(RetryAfterOriginal::Accepted)
    );
    assert_eq!(mount.outputs, Some(OutputsChoice::Confirm));
    let defaults = parse(GOOD).expect("valid config");
    let (_, mount) = defaults.mounts().next().expect("one mount");
    assert_eq!(mount.max_message_size, Mount::DEFAULT_MAX_MESSAGE_SIZE);
    assert_eq!(
        (mount.retry, mount.delay, mount.outputs),
        (None, None, None)
    );
    assert_eq!(mount.retry_after_original, None);
    let e = error(&format!("{GOOD}delay = \"later\"\n"));
    assert!(e.contains("delay"), "{e}");
    let e = error(&format!("{GOOD}outputs = \"twice\"\n"));
    assert!(e.contains("outputs") && e.contains("transaction"), "{e}");
}

#[test]
fn memory_past_what_a_linear_memory_addresses_is_refused_naming_the_mount() {
    let e = error(&GOOD.replace(r#"memory = "64MiB""#, r#"memory = "5GiB""#));
    assert!(e.contains("`memory` must be at most 4GiB"), "{e}");
    assert!(e.contains("orders"), "the mount is not named: {e}");
}

#[test]
fn max_instances_must_be_positive() {
    let e = error("[broker]\nurl = \"amqp://h\"\n[host]\nmax_instances = 0\n");
    assert!(e.contains("at least 1"), "{e}");
}

/// A file beside the test configs, holding `text`.
fn secret_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wharf-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("secret file");
    path
}

#[test]
fn passwords_come_from_a_file_or_the_environment_and_never_show() {
    let file = secret_file("broker-password", "s3cret-from-file\n");
    let config = parse(&format!(
        "[broker]\nurl = \"amqp://127.0.0.1\"\nuser = \"wharf\"\npassword_file = \"{}\"\n",
        file.display()
    ))
    .expect("valid config");
    let credentials = &config.broker.credentials;
    assert_eq!(credentials.mechanism, SaslMechanism::Plain);
    assert_eq!(credentials.user.as_deref(), Some("wharf"));
    assert_eq!(
        credentials.password.as_ref().map(Secret::expose),
        Some("s3cret-from-file")
    );
    assert!(
        !format!("{config:?}").contains("s3cret"),
        "Debug shows no secret"
    );

    // A variable every process has; setting one would race other tests.
    let config =
        parse("[broker]\nurl = \"amqp://127.0.0.1\"\nuser = \"w\"\npassword_env = \"PATH\"\n")
            .expect("valid config");
    assert_eq!(
        config
            .broker
            .credentials
            .password
            .as_ref()
            .map(Secret::expose),
        std::env::var("PATH").ok().as_deref()
    );

    let e = error(
        "[broker]\nurl = \"amqp://127.0.0.1\"\nuser = \"w\"\npassword_env = \"WHARF_TEST_UNSET_VARIABLE\"\n",
    );
    assert!(e.contains("`WHARF_TEST_UNSET_VARIABLE` is not set"), "{e}");
    let e = error(
        "[broker]\nurl = \"amqp://127.0.0.1\"\nuser = \"w\"\npassword_file = \"no/such/file\"\n",
    );
    assert!(
        e.contains("line 4") && e.contains("`password_file`: cannot read"),
        "{e}"
    );
    let e = error(&format!(
        "[broker]\nurl = \"amqp://u:inline@127.0.0.1\"\npassword_file = \"{}\"\n",
        file.display()
    ));
    assert!(e.contains("give it once") && !e.contains("inline"), "{e}");
}

#[test]
fn plain_without_tls_is_refused_off_this_machine() {
    let e = error("[broker]\nurl = \"amqp://u:hunter2@broker.example\"\n");
    assert!(
        e.contains("without TLS") && e.contains("allow_plain_without_tls"),
        "{e}"
    );
    assert!(!e.contains("hunter2"), "{e}");
    for ok in [
        "[broker]\nurl = \"amqp://u:p@localhost\"\n",
        "[broker]\nurl = \"amqp://u:p@[::1]:5672\"\n",
        "[broker]\nurl = \"amqp://u:p@broker.example\"\nallow_plain_without_tls = true\n",
        "[broker]\nurl = \"amqp://u:p@broker.example\"\nsasl = \"scram-sha-256\"\n",
        "[broker]\nurl = \"amqp://broker.example\"\n",
    ] {
        parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn sasl_mechanisms_are_checked_against_what_they_need() {
    let e = error("[broker]\nurl = \"amqp://127.0.0.1\"\nsasl = \"plain\"\n");
    assert!(e.contains("SASL PLAIN needs a user and a password"), "{e}");
    let e = error("[broker]\nurl = \"amqp://127.0.0.1\"\nsasl = \"external\"\n");
    assert!(
        e.contains("EXTERNAL needs `amqps://` URLs and a client certificate"),
        "{e}"
    );
    let e = error("[broker]\nurl = \"amqp://127.0.0.1\"\nsasl = \"kerberos\"\n");
    assert!(
        e.contains("kerberos") || e.contains("unknown variant"),
        "{e}"
    );
    let e = error("[broker]\nurl = \"amqp://127.0.0.1\"\n[broker.tls]\nca_file = \"ca.pem\"\n");
    assert!(e.contains("`[tls]` needs `amqps://` URLs"), "{e}");
    let e = error("[broker]\nurl = [\"amqps://a\", \"amqp://b\"]\n");
    assert!(e.contains("mixes"), "{e}");
}

#[test]
fn tls_files_are_read_at_load_and_named_when_bad() {
    let e = error(
        "[broker]\nurl = \"amqps://broker.example\"\n[broker.tls]\nca_file = \"missing-ca.pem\"\n",
    );
    assert!(
        e.contains("`ca_file`") && e.contains("missing-ca.pem") && e.contains("cannot read"),
        "{e}"
    );
    let not_pem = secret_file("not-a-cert.pem", "hello\n");
    let e = error(&format!(
        "[broker]\nurl = \"amqps://broker.example\"\n[broker.tls]\nca_file = \"{}\"\n",
        not_pem.display()
    ));
    assert!(
        e.contains("not-a-cert.pem") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = error(&format!(
        "[broker]\nurl = \"amqps://broker.example\"\n[broker.tls]\ncert_file = \"{}\"\n",
        not_pem.display()
    ));
    assert!(e.contains("go together"), "{e}");
}

#[test]
fn the_admin_listener_needs_a_token_off_loopback() {
    let e = error("[broker]\nurl = \"amqp://h\"\n[admin]\nlisten = \"0.0.0.0:9090\"\n");
    assert!(e.contains("line 4") && e.contains("token_file"), "{e}");
    let token = secret_file("admin-token", "t0ken\n");
    let config = parse(&format!(
        "[broker]\nurl = \"amqp://h\"\n[admin]\nlisten = \"0.0.0.0:9090\"\ntoken_file = \"{}\"\n",
        token.display()
    ))
    .expect("valid config");
    let admin = config.admin.expect("admin");
    assert_eq!(admin.token.as_ref().map(Secret::expose), Some("t0ken"));
    let local = parse("[broker]\nurl = \"amqp://h\"\n[admin]\nlisten = \"127.0.0.1:9090\"\n")
        .expect("valid config");
    assert_eq!(local.admin.expect("admin").token, None);
}

#[test]
fn a_parse_error_never_repeats_a_quoted_value() {
    let e = error("[broker]\nurl = \"amqp://u:hunter2@host:5672\n[host]\n");
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("line 2") || e.contains("2 |"), "{e}");
    let e = error("[broker]\nurl = 5\npassword_env = \"MY_SECRET_NAME\"\n");
    assert!(!e.contains("MY_SECRET_NAME") || e.contains("`url`"), "{e}");
    assert_eq!(
        security::redact_quoted("a = \"x\\\"y\" b = 'z' c = \"open"),
        "a = \"***\" b = '***' c = \"***"
    );
}

const SENDS: &str = r#"
[broker]
url = "amqp://127.0.0.1"
[[tenant]]
name = "a"
[[tenant.mount]]
name = "m"
module = "handlers/orders.wasm"
address = "a.in"
max_outputs = 3
max_output_bytes = "4KiB"
[tenant.mount.grants]
send = ["a.*", "audit"]
reply = true
[[tenant]]
name = "b"
[[tenant.mount]]
name = "m"
module = "handlers/orders.wasm"
address = "b.in"
"#;

#[test]
fn send_grants_and_output_limits_parse() {
    let config = parse(SENDS).expect("valid config");
    let (_, mount) = config.mounts().next().expect("a mount");
    let grants = &mount.grants;
    assert_eq!(
        grants.send,
        vec![AddressPattern::new("a.*"), AddressPattern::new("audit")]
    );
    assert_eq!(grants.reply, ReplyGrant::Any);
    assert_eq!(grants.outputs.max_outputs, 3);
    assert_eq!(grants.outputs.max_output_bytes, 4096);
    let (_, other) = config.mounts().nth(1).expect("b's mount");
    assert!(
        other.grants.send.is_empty() && !other.grants.reply.granted(),
        "deny by default"
    );
    assert_eq!(other.grants.outputs, OutputLimits::default());
}

#[test]
fn a_wildcard_never_reaches_another_tenants_address() {
    let text = SENDS.replace(r#"send = ["a.*", "audit"]"#, r#"send = ["*.in"]"#);
    let message = error(&text);
    assert!(
        message.contains("tenant `a`, mount `m`")
            && message.contains("`*.in` matches `b.in`, an address of tenant `b`")
            && message.contains("line 13"),
        "{message}"
    );
    // Written out in full, the other tenant's address is a deliberate grant.
    let text = SENDS.replace(r#"send = ["a.*", "audit"]"#, r#"send = ["b.in"]"#);
    parse(&text).expect("a literal grant of another tenant's address");
}

#[test]
fn zero_outputs_and_empty_patterns_are_refused() {
    let message = error(&SENDS.replace("max_outputs = 3", "max_outputs = 0"));
    assert!(
        message.contains("`max_outputs` must be at least 1"),
        "{message}"
    );
    let message = error(&SENDS.replace(r#""audit""#, r#""""#));
    assert!(message.contains("empty address pattern"), "{message}");
}

#[test]
fn http_grants_parse_and_learn_the_admin_listener() {
    let text = SENDS.replace(
        "reply = true",
        "reply = true\nhttp = [\"https://api.example.com\", \"http://127.0.0.1:8080\"]",
    ) + "[admin]\nlisten = \"127.0.0.1:9090\"\n";
    let config = parse(&text).expect("valid config");
    let (_, mount) = config.mounts().next().expect("a mount");
    let allowed: Vec<&str> = mount
        .grants
        .http
        .allowed
        .iter()
        .map(|p| p.as_str())
        .collect();
    assert_eq!(
        allowed,
        ["https://api.example.com", "http://127.0.0.1:8080"]
    );
    assert_eq!(
        mount.grants.http.admin,
        Some("127.0.0.1:9090".parse().expect("an address"))
    );
    let (_, other) = config.mounts().nth(1).expect("a second mount");
    assert!(other.grants.http.allowed.is_empty(), "deny by default");
}

#[test]
fn an_http_grant_that_is_not_an_origin_is_refused_naming_it() {
    let text = SENDS.replace(
        "reply = true",
        "reply = true\nhttp = [\"https://api.example.com/v1\"]",
    );
    let message = error(&text);
    assert!(
        message.contains("tenant `a`, mount `m`: `grants.http`")
            && message.contains("`https://api.example.com/v1` is not an origin")
            && message.contains("it has a path")
            && message.contains("line 15"),
        "{message}"
    );
}

fn topic(extra: &str) -> String {
    format!(
        "[broker]\nurl = \"amqp://h\"\n[[tenant]]\nname = \"t\"\n[[tenant.mount]]\nname = \"m\"\nmodule = \"handlers/orders.wasm\"\naddress = \"events\"\n{extra}\n"
    )
}

#[test]
fn a_topic_mount_subscribes_durably_and_shared_under_a_name_of_its_own() {
    let config = parse(&topic("node = \"topic\"")).expect("config");
    let (_, mount) = config.mounts().next().expect("a mount");
    assert_eq!(
        mount.subscription,
        Some(TopicSubscription {
            kind: SubscriptionKind::DurableShared,
            name: "wharf.t.m".to_owned(),
            retry_copies_to: RetryCopiesTo::Address,
        })
    );
    let queue = parse(&topic("")).expect("config");
    assert_eq!(queue.mounts().next().expect("a mount").1.subscription, None);
}

#[test]
fn subscription_keys_need_a_topic_and_copies_to_the_subscription_a_durable_one() {
    let e = error(&topic("subscription = \"durable\""));
    assert!(
        e.contains("`subscription` only applies with `node = \"topic\"`"),
        "{e}"
    );
    let e = error(&topic(
        "node = \"topic\"\nsubscription = \"volatile\"\nretry_copies_to = \"subscription\"",
    ));
    assert!(e.contains("needs a durable subscription"), "{e}");
    let e = error(&topic("node = \"topic\"\nsubscription_name = \"a|b\""));
    assert!(e.contains("subscription name `a|b`"), "{e}");
}

#[test]
fn two_topic_mounts_cannot_share_a_subscription_name() {
    let mut text = topic("node = \"topic\"\nsubscription_name = \"s\"");
    text.push_str(
        "[[tenant]]\nname = \"u\"\n[[tenant.mount]]\nname = \"n\"\nmodule = \"handlers/orders.wasm\"\naddress = \"other\"\nnode = \"topic\"\nsubscription_name = \"s\"\n",
    );
    let e = error(&text);
    assert!(
        e.contains("subscription `s` is already the subscription of tenant `t`, mount `m`"),
        "{e}"
    );
}

#[test]
fn a_telemetry_section_is_read_and_a_bad_sampler_refused_with_its_line() {
    let text = format!(
        "{GOOD}\n[telemetry]\nendpoint = \"http://collector:4317\"\nprotocol = \"grpc\"\nsampler = \"parentbased_traceidratio\"\nsampler_ratio = 0.25\nparent = \"link\"\nexport_delay = \"2s\"\n"
    );
    let telemetry = parse(&text).expect("valid config").telemetry;
    assert_eq!(telemetry.protocol, Some(OtlpProtocol::Grpc));
    assert_eq!(telemetry.parent, ParentMode::Link);
    assert_eq!(telemetry.export_delay, Some(Duration::from_secs(2)));
    assert_eq!(parse(GOOD).expect("valid").telemetry, Telemetry::default());
    let bad = error(&format!("{GOOD}\n[telemetry]\nsampler = \"sometimes\"\n"));
    assert!(bad.contains("sometimes") && bad.contains("line"), "{bad}");
}

/// A folder of its own for one test's files, removed at the end.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let dir = std::env::temp_dir().join(format!(
            "wharf-config-include-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Folder(dir)
    }

    /// Writes `name`, and an empty `h.wasm` beside it for its mounts.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        let folder = path.parent().expect("a folder");
        std::fs::create_dir_all(folder).expect("folder");
        std::fs::write(folder.join("h.wasm"), b"").expect("module");
        std::fs::write(&path, text).expect("file");
        path
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tenant file with one mount on `address`, its module beside it.
fn tenant_file(tenant: &str, address: &str) -> String {
    format!(
        "[[tenant]]\nname = \"{tenant}\"\n[[tenant.mount]]\nname = \"m\"\nmodule = \"h.wasm\"\naddress = \"{address}\"\n"
    )
}

const INCLUDING: &str = "include = [\"tenants\"]\n[broker]\nurl = \"amqp://127.0.0.1\"\n";

#[test]
fn included_folders_add_their_tenant_files_and_their_subfolders() {
    let folder = Folder::new("folders");
    folder.write("tenants/a.toml", &tenant_file("a", "qa"));
    // One ConfigMap per team, mounted in a subfolder: its files are links
    // into a hidden `..data` folder, which is not read again.
    folder.write("tenants/team-b/b.toml", &tenant_file("b", "qb"));
    folder.write("tenants/team-b/..data/b.toml", &tenant_file("b", "qb"));
    folder.write("tenants/notes.txt", "not a config");
    let main = folder.write("wharf.toml", INCLUDING);
    let config = Config::load(&main).expect("loads");
    let names: Vec<&str> = config.tenants.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(config.files.len(), 3, "{:?}", config.files);
    // Module paths are relative to the file that names them.
    let (_, mount) = config.mounts().nth(1).expect("b's mount");
    assert!(mount.module.ends_with("tenants/team-b/h.wasm"), "{mount:?}");
}

#[test]
fn an_error_in_an_included_file_names_that_file_and_line() {
    let folder = Folder::new("errors");
    folder.write("tenants/a.toml", &tenant_file("a", "qa"));
    folder.write(
        "tenants/b.toml",
        &tenant_file("b", "qb").replace("address", "adress"),
    );
    let main = folder.write("wharf.toml", INCLUDING);
    let error = Config::load(&main).expect_err("refused").to_string();
    assert!(error.contains("tenants/b.toml"), "{error}");
    assert!(error.contains("adress"), "{error}");

    // Checks across files: a second tenant taking the first's address.
    folder.write("tenants/b.toml", &tenant_file("b", "qa"));
    let error = Config::load(&main).expect_err("refused").to_string();
    assert!(error.contains("tenants/b.toml`, line 6"), "{error}");
    assert!(error.contains("tenant `a`"), "{error}");

    // Only tenants in an included file.
    folder.write("tenants/b.toml", "[host]\nmax_instances = 5\n");
    let error = Config::load(&main).expect_err("refused").to_string();
    assert!(error.contains("tenants/b.toml"), "{error}");

    let missing = folder.write(
        "wharf.toml",
        "include = [\"nowhere\"]\n[broker]\nurl = \"amqp://127.0.0.1\"\n",
    );
    let error = Config::load(&missing).expect_err("refused").to_string();
    assert!(
        error.contains("wharf.toml`, line 1") && error.contains("nowhere"),
        "{error}"
    );
}

#[test]
fn ordered_mounts_read_their_key_and_bound() {
    let config = parse(&format!(
        "{GOOD}order_by = \"property:account\"\nmax_keys = 500\n"
    ))
    .expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(mount.order_by, Some(OrderBy::Property("account".into())));
    assert_eq!(mount.max_keys, 500);
    let config = parse(&format!("{GOOD}order_by = \"group-id\"\n")).expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(
        (mount.order_by.clone(), mount.max_keys),
        (Some(OrderBy::GroupId), Mount::DEFAULT_MAX_KEYS)
    );
}

#[test]
fn ordered_mounts_refuse_what_cannot_hold_a_key() {
    let e = error(&format!("{GOOD}order_by = \"account\"\n"));
    assert!(e.contains("line 20") && e.contains("neither"), "{e}");
    let at_most_once = GOOD.replace("at-least-once", "at-most-once");
    let e = error(&format!("{at_most_once}order_by = \"group-id\"\n"));
    assert!(e.contains("needs `settle = \"at-least-once\"`"), "{e}");
    let e = error(&format!(
        "{GOOD}order_by = \"group-id\"\nretry = \"copy\"\n"
    ));
    assert!(
        e.contains("line 21") && e.contains("`retry` does not apply with `order_by`"),
        "{e}"
    );
    let e = error(&format!("{GOOD}max_keys = 10\n"));
    assert!(e.contains("`max_keys` only applies with `order_by`"), "{e}");
    let e = error(&format!("{GOOD}order_by = \"group-id\"\nmax_keys = 0\n"));
    assert!(e.contains("max_keys"), "{e}");
}

#[test]
fn a_breaker_reads_its_bounds_and_refuses_nonsense() {
    let config = parse(&format!(
        "{GOOD}[tenant.mount.breaker]\nfailure_rate = 0.25\nwindow = \"10s\"\n"
    ))
    .expect("valid config");
    let (_, mount) = config.mounts().next().expect("one mount");
    assert_eq!(
        mount.breaker,
        Some(crate::breaker::BreakerPolicy {
            failure_rate: 0.25,
            min_deliveries: crate::breaker::BreakerPolicy::DEFAULT_MIN_DELIVERIES,
            window: std::time::Duration::from_secs(10),
            open_for: crate::breaker::BreakerPolicy::DEFAULT_OPEN_FOR,
        })
    );
    let (_, mount) = parse(GOOD)
        .expect("valid")
        .mounts()
        .next()
        .map(|(t, m)| (t.clone(), m.clone()))
        .expect("one");
    assert_eq!(mount.breaker, None, "off unless configured");
    let e = error(&format!(
        "{GOOD}[tenant.mount.breaker]\nfailure_rate = 1.5\n"
    ));
    assert!(
        e.contains("line 21") && e.contains("`failure_rate` must be above 0 and at most 1"),
        "{e}"
    );
    let e = error(&format!(
        "{GOOD}[tenant.mount.breaker]\nmin_deliveries = 0\n"
    ));
    assert!(e.contains("`min_deliveries` must be at least 1"), "{e}");
    let e = error(&format!(
        "{GOOD}[tenant.mount.breaker]\nopen_for = \"1ms\"\n"
    ));
    assert!(e.contains("`open_for` must be at least 100ms"), "{e}");
    let e = error(&format!("{GOOD}[tenant.mount.breaker]\nthreshold = 3\n"));
    assert!(e.contains("threshold"), "{e}");
}

/// The same broker as `amqp://127.0.0.1`, spelt otherwise: the default
/// port written out, another user, the host in capitals, a cluster listing
/// it among other nodes.
const SAME_BROKER: &[&str] = &[
    "amqp://127.0.0.1:5672",
    "amqp://someone:secret@127.0.0.1",
    "amqp://LOCALHOST.example:5672\", \"amqp://127.0.0.1",
];

#[test]
fn tenants_cannot_share_an_address_on_one_broker_under_another_url() {
    for url in SAME_BROKER {
        let text = TWO_TENANTS
            .replace("url = \"amqp://other:5672\"", &format!("url = [\"{url}\"]"))
            .replace("address = \"b.q\"", "address = \"a.q\"");
        let e = error(&text);
        assert!(e.contains("already belongs to tenant `a`"), "{url}: {e}");
    }
    // A cluster's nodes in another order are the same cluster.
    let text = TWO_TENANTS
        .replace(
            "url = \"amqp://127.0.0.1\"",
            "url = [\"amqp://n1:5672\", \"amqp://n2:5672\"]",
        )
        .replace(
            "url = \"amqp://other:5672\"",
            "url = [\"amqp://N2\", \"amqp://n1\"]",
        )
        .replace("address = \"b.q\"", "address = \"a.q\"");
    assert!(error(&text).contains("already belongs to tenant `a`"));
}

#[test]
fn a_wildcard_never_reaches_another_tenants_address_on_the_same_broker_under_another_url() {
    for url in SAME_BROKER {
        let text = SENDS
            .replace(r#"send = ["a.*", "audit"]"#, r#"send = ["*.in"]"#)
            .replace(
                "[[tenant]]\nname = \"b\"\n",
                &format!("[[tenant]]\nname = \"b\"\n[tenant.broker]\nurl = [\"{url}\"]\ncontainer_id = \"b\"\n"),
            );
        let message = error(&text);
        assert!(
            message.contains("`*.in` matches `b.in`, an address of tenant `b`"),
            "{url}: {message}"
        );
    }
}
