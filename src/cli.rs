//! The `crius` command line: global options anywhere, then a command (serve by default).
//!
//! Parsed with `lexopt` rather than clap: crius's machine code is most of its resident
//! memory, and clap's parser and generated code were 180 KB of it for seven commands.

use std::ffi::OsString;
use std::path::PathBuf;

/// The usage text of `crius --help`.
pub const USAGE: &str = "\
A Kubernetes CRI runtime and image service for containerd

Usage: crius [OPTIONS] [COMMAND]

Commands:
  serve           Serve the CRI (the default when no command is given)
  config default  Print the complete default configuration, commented
  config check    Validate a configuration file and exit non-zero naming the offending key
  config migrate  Print the crius config equivalent to the CRI settings of a containerd
                  config.toml; what cannot be carried over is listed on stderr
                    --from <FILE>       containerd's config file (versions 1, 2 and 3)
                    --hosts-dir <DIR>   directory to write hosts.toml files into for the
                                        deprecated registry mirrors and TLS settings (it
                                        becomes registry.config_path)
  check           Check, without changing anything, that this host can run crius with its
                  config; exits non-zero when a check fails
  metrics         List every metric crius exports, with its type and meaning
  version         Print the version

Options:
  -c, --config <FILE>     The config file [env: CRIUS_CONFIG] [default:
                          /etc/crius/config.toml when it exists, else built-in defaults]
      --log-level <LEVEL> Override the configured log level (error, warn, info, debug,
                          trace, or a filter)
  -h, --help              Print help
  -V, --version           Print the version
";

/// What the command line asks for.
#[derive(Debug, PartialEq)]
pub struct Cli {
    pub config: Option<PathBuf>,
    pub log_level: Option<String>,
    pub command: Command,
}

#[derive(Debug, PartialEq)]
pub enum Command {
    Serve,
    ConfigDefault,
    ConfigCheck,
    ConfigMigrate {
        from: PathBuf,
        hosts_dir: Option<PathBuf>,
    },
    Check,
    Metrics,
    Version,
    Help,
}

/// Parses the arguments after the program name; `env_config` is `CRIUS_CONFIG`, used when
/// `--config` is not given. The error is a one-line message.
pub fn parse(
    args: impl IntoIterator<Item = OsString>,
    env_config: Option<OsString>,
) -> Result<Cli, String> {
    use lexopt::Arg::{Long, Short, Value};
    let mut parser = lexopt::Parser::from_args(args);
    let mut config = None;
    let mut log_level = None;
    let mut from = None;
    let mut hosts_dir = None;
    let mut words = Vec::new();
    let mut help = false;
    let mut version = false;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('c') | Long("config") => config = Some(path_value(&mut parser)?),
            Long("log-level") => log_level = Some(string_value(&mut parser)?),
            Long("from") => from = Some(path_value(&mut parser)?),
            Long("hosts-dir") => hosts_dir = Some(path_value(&mut parser)?),
            Short('h') | Long("help") => help = true,
            Short('V') | Long("version") => version = true,
            Value(word) => words.push(
                word.into_string()
                    .map_err(|w| format!("unknown command {w:?}"))?,
            ),
            other => return Err(other.unexpected().to_string()),
        }
    }
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let command = if help || words.first() == Some(&"help") {
        Command::Help
    } else if version {
        Command::Version
    } else {
        command_for(&words, from, hosts_dir)?
    };
    Ok(Cli {
        config: config.or_else(|| env_config.filter(|c| !c.is_empty()).map(PathBuf::from)),
        log_level,
        command,
    })
}

/// The command the words name; `--from` and `--hosts-dir` belong to `config migrate` only.
fn command_for(
    words: &[&str],
    from: Option<PathBuf>,
    hosts_dir: Option<PathBuf>,
) -> Result<Command, String> {
    let migrate_options = || {
        if from.is_some() || hosts_dir.is_some() {
            Err("--from and --hosts-dir belong to `config migrate`".to_string())
        } else {
            Ok(())
        }
    };
    let command = match words {
        [] | ["serve"] => Command::Serve,
        ["config", "default"] => Command::ConfigDefault,
        ["config", "check"] => Command::ConfigCheck,
        ["config", "migrate"] => {
            return match from {
                Some(from) => Ok(Command::ConfigMigrate { from, hosts_dir }),
                None => Err("`config migrate` needs --from <FILE>".to_string()),
            };
        }
        ["config"] => return Err("`config` needs an action: default, check or migrate".into()),
        ["check"] => Command::Check,
        ["metrics"] => Command::Metrics,
        ["version"] => Command::Version,
        _ => return Err(format!("unknown command `{}`", words.join(" "))),
    };
    migrate_options()?;
    Ok(command)
}

fn string_value(parser: &mut lexopt::Parser) -> Result<String, String> {
    let value = parser.value().map_err(|e| e.to_string())?;
    value
        .into_string()
        .map_err(|v| format!("{v:?} is not valid UTF-8"))
}

fn path_value(parser: &mut lexopt::Parser) -> Result<PathBuf, String> {
    parser.value().map(PathBuf::from).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(args: &str, env: Option<&str>) -> Result<Cli, String> {
        parse(
            args.split_whitespace().map(OsString::from),
            env.map(OsString::from),
        )
    }

    #[test]
    fn no_command_serves() {
        let cli = parse_str("", None).unwrap();
        assert_eq!(cli.command, Command::Serve);
        assert_eq!(cli.config, None);
        assert_eq!(parse_str("serve", None).unwrap().command, Command::Serve);
    }

    #[test]
    fn global_options_go_before_or_after_the_command() {
        for args in [
            "--config /x.toml config check",
            "config check --config /x.toml",
            "config -c /x.toml check",
            "config check --config=/x.toml",
        ] {
            let cli = parse_str(args, None).unwrap();
            assert_eq!(cli.command, Command::ConfigCheck, "{args}");
            assert_eq!(cli.config, Some(PathBuf::from("/x.toml")), "{args}");
        }
        let cli = parse_str("--log-level debug", None).unwrap();
        assert_eq!(cli.log_level.as_deref(), Some("debug"));
    }

    #[test]
    fn the_environment_names_the_config_unless_the_option_does() {
        let cli = parse_str("check", Some("/env.toml")).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/env.toml")));
        let cli = parse_str("check -c /opt.toml", Some("/env.toml")).unwrap();
        assert_eq!(cli.config, Some(PathBuf::from("/opt.toml")));
        assert_eq!(parse_str("check", Some("")).unwrap().config, None);
    }

    #[test]
    fn migrate_takes_its_own_options() {
        let cli = parse_str("config migrate --from /c.toml --hosts-dir /h", None).unwrap();
        assert_eq!(
            cli.command,
            Command::ConfigMigrate {
                from: PathBuf::from("/c.toml"),
                hosts_dir: Some(PathBuf::from("/h")),
            }
        );
        assert!(
            parse_str("config migrate", None)
                .unwrap_err()
                .contains("--from")
        );
        assert!(parse_str("check --from /c.toml", None).is_err());
    }

    #[test]
    fn help_and_version_win_over_the_command() {
        assert_eq!(
            parse_str("check --help", None).unwrap().command,
            Command::Help
        );
        assert_eq!(parse_str("help", None).unwrap().command, Command::Help);
        assert_eq!(parse_str("-V", None).unwrap().command, Command::Version);
        assert_eq!(
            parse_str("version", None).unwrap().command,
            Command::Version
        );
    }

    #[test]
    fn mistakes_are_named() {
        assert!(parse_str("serv", None).unwrap_err().contains("serv"));
        assert!(parse_str("config", None).unwrap_err().contains("action"));
        assert!(parse_str("--bogus", None).unwrap_err().contains("bogus"));
        assert!(parse_str("--config", None).is_err());
        assert!(parse_str("check extra", None).is_err());
    }
}
