//! `--kafka-config FILE` and `--kafka-setting KEY=VALUE`: the librdkafka
//! settings of a `kafka://` broker (TLS, SASL, anything librdkafka takes),
//! passed through to every Kafka client the command makes.
//!
//! A value may be a secret (`sasl.password`, `ssl.key.password`): no
//! message here quotes one, nor a line of the file, nor an argument that is
//! not `KEY=VALUE` (it may be a secret typed wrong); they name the key, the
//! line number or the position instead. librdkafka's own refusals come back
//! through `intake_kafka::Error`, which hides the values of secret settings.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::failure::Failure;

/// The environment variable that names the settings file when
/// `--kafka-config` is not given. It applies to `kafka://` only, and is
/// ignored for the other brokers (a shell may export it for every
/// command).
pub const CONFIG_ENV: &str = "INTAKE_KAFKA_CONFIG";

/// One `--kafka-setting` as typed, read later so that a malformed one is
/// reported without its text. `Debug` shows the key only.
#[derive(Clone)]
pub struct RawSetting(String);

impl fmt::Debug for RawSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.split_once('=') {
            Some((key, _)) => write!(f, "RawSetting({key}=***)"),
            None => f.write_str("RawSetting(***)"),
        }
    }
}

/// clap's parser of `--kafka-setting`: takes anything, so that clap never
/// repeats a value in a usage error; [`load`] checks it.
pub fn raw_setting(text: &str) -> Result<RawSetting, std::convert::Infallible> {
    Ok(RawSetting(text.to_owned()))
}

/// The settings of `config` (or the file [`CONFIG_ENV`] names, when
/// `from_env`), then of `settings` in order, a later one replacing an
/// earlier one of the same key.
///
/// # Errors
///
/// A usage failure for an unreadable file, a line or argument that is not
/// `KEY=VALUE`, or a key the command sets itself (the brokers, the group).
pub fn load(
    config: Option<&Path>,
    from_env: bool,
    settings: &[RawSetting],
) -> Result<Vec<(String, String)>, Failure> {
    let env_config = from_env
        .then(|| std::env::var_os(CONFIG_ENV))
        .flatten()
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    let mut loaded: Vec<(String, String)> = Vec::new();
    let mut put = |key: &str, value: &str, whence: &dyn Fn() -> String| {
        check_key(key, whence)?;
        loaded.retain(|(known, _)| known != key);
        loaded.push((key.to_owned(), value.to_owned()));
        Ok::<(), Failure>(())
    };
    if let Some(path) = config.or(env_config.as_deref()) {
        let text = std::fs::read_to_string(path).map_err(|error| {
            Failure::Usage(format!(
                "--kafka-config {}: cannot be read ({error})",
                path.display()
            ))
        })?;
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let whence = || format!("--kafka-config {} line {}", path.display(), index + 1);
            let (key, value) = split(line)
                .ok_or_else(|| Failure::Usage(format!("{}: not KEY=VALUE", whence())))?;
            put(key, value, &whence)?;
        }
    }
    for (index, setting) in settings.iter().enumerate() {
        let whence = || format!("--kafka-setting number {}", index + 1);
        let (key, value) = split(&setting.0).ok_or_else(|| {
            Failure::Usage(format!(
                "{}: not KEY=VALUE (for example security.protocol=SSL)",
                whence()
            ))
        })?;
        put(key, value, &whence)?;
    }
    Ok(loaded)
}

/// `KEY=VALUE` with blanks around either trimmed; `None` without `=` or
/// with an empty key.
fn split(text: &str) -> Option<(&str, &str)> {
    let (key, value) = text.split_once('=')?;
    let key = key.trim();
    let valid = !key.is_empty() && !key.contains(char::is_whitespace);
    valid.then_some((key, value.trim()))
}

/// Refuses the settings the command makes from its own options.
fn check_key(key: &str, whence: &dyn Fn() -> String) -> Result<(), Failure> {
    let owned_by = match key {
        "bootstrap.servers" | "metadata.broker.list" => "--broker kafka://HOST:PORT",
        "group.id" => "--group",
        _ => return Ok(()),
    };
    Err(Failure::Usage(format!(
        "{}: {key} is set by {owned_by}",
        whence()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(settings: &[&str]) -> Vec<RawSetting> {
        settings
            .iter()
            .map(|s| RawSetting((*s).to_owned()))
            .collect()
    }

    #[test]
    fn a_file_then_the_options_later_ones_winning() {
        let dir = std::env::temp_dir().join(format!("intake-cli-kafka-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("client.properties");
        std::fs::write(
            &file,
            "# TLS and SASL\n! also a comment\n\nsecurity.protocol = SASL_SSL\n\
             sasl.password=p=w=d\nsasl.mechanisms=PLAIN\n",
        )
        .unwrap();
        let loaded = load(
            Some(&file),
            false,
            &raw(&["sasl.mechanisms=SCRAM-SHA-512", "client.id=ops"]),
        )
        .unwrap();
        assert_eq!(
            loaded,
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.password", "p=w=d"),
                ("sasl.mechanisms", "SCRAM-SHA-512"),
                ("client.id", "ops"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        std::fs::write(&file, "security.protocol=SSL\nsasl.password hunter2\n").unwrap();
        let error = load(Some(&file), false, &[]).unwrap_err();
        assert_eq!(error.exit_code(), 2);
        assert!(
            error.to_string().contains("line 2: not KEY=VALUE"),
            "{error}"
        );
        assert!(!error.to_string().contains("hunter2"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_malformed_or_reserved_setting_is_a_usage_error_without_its_value() {
        for (given, says) in [
            ("sasl.password:hunter2", "number 1: not KEY=VALUE"),
            ("=hunter2", "number 1: not KEY=VALUE"),
            (
                "bootstrap.servers=hunter2:9092",
                "bootstrap.servers is set by --broker",
            ),
            ("group.id=hunter2", "group.id is set by --group"),
        ] {
            let error = load(None, false, &raw(&[given])).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{given}");
            let shown = format!("{error} {error:?}");
            assert!(shown.contains(says), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        let missing = load(Some(Path::new("/nonexistent/kafka.properties")), false, &[]);
        assert_eq!(missing.unwrap_err().exit_code(), 2);
        assert!(!format!("{:?}", raw(&["sasl.password=hunter2"])).contains("hunter2"));
    }
}
