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
