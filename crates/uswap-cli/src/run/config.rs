//! `uswap run --config FILE`: options from a file, one `name = value` per
//! line (the long option's name, without `--`; `#` starts a comment; a
//! switch takes `true` or `false`). Precedence: command line, then the
//! environment (`USWAP_*`), then the file, then the defaults.

use std::ffi::OsString;

/// The variable naming a config file when `--config` is not given.
pub const CONFIG_ENV: &str = "USWAP_CONFIG";

/// The config file `uswap run` arguments name, if any: among uswap's own
/// options, which end at `--` or at the program's name (its arguments are
/// its own, a `--config` among them included). Every option of `uswap run`
/// but `--help` takes a value.
fn config_path(args: &[OsString]) -> Option<OsString> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let Some(s) = a.to_str() else {
            break;
        };
        if s == "--" || s == "-" || !s.starts_with('-') {
            break;
        }
        if s == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = s.strip_prefix("--config=") {
            return Some(v.into());
        }
        if !s.contains('=') && s != "-h" && s != "--help" {
            it.next();
        }
    }
    std::env::var_os(CONFIG_ENV)
}

/// The options of `text` as command line arguments (`--name value`),
/// leaving out those set in the environment.
pub fn options(text: &str) -> Result<Vec<OsString>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (name, value) = line
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .ok_or_else(|| format!("line {}: expected `name = value`, found `{raw}`", n + 1))?;
        if name.is_empty() || name.starts_with('-') || name == "config" {
            return Err(format!("line {}: `{name}` is not an option name", n + 1));
        }
        let env = format!("USWAP_{}", name.to_uppercase().replace('-', "_"));
        if std::env::var_os(&env).is_some() {
            continue;
        }
        match value {
            "true" => out.push(format!("--{name}").into()),
            "false" => {}
            v => {
                out.push(format!("--{name}").into());
                out.push(v.into());
            }
        }
    }
    Ok(out)
}

/// The command line with a config file's options put in front of the
/// user's (which override them), for `uswap run`.
pub fn expand(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    if args.get(1).is_none_or(|a| a != "run") {
        return Ok(args);
    }
    let Some(path) = config_path(&args[2..]) else {
        return Ok(args);
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading config file {}: {e}", path.to_string_lossy()))?;
    let from_file =
        options(&text).map_err(|e| format!("config file {}: {e}", path.to_string_lossy()))?;
    let mut out = args[..2].to_vec();
    out.extend(from_file);
    out.extend(args[2..].iter().cloned());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_file_reads_as_options() {
        let text = "# limits\nmemory-high = 1G\n\ncompressor=zstd # fast enough\nno-such = 3\nverify = true\nquiet = false\n";
        let got: Vec<String> = options(text)
            .unwrap()
            .into_iter()
            .map(|o| o.into_string().unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "--memory-high",
                "1G",
                "--compressor",
                "zstd",
                "--no-such",
                "3",
                "--verify"
            ]
        );
        assert!(options("memory-high 1G").is_err());
        assert!(options("--memory-high = 1G").is_err());
    }

    /// Found by a check of bad values: a `--config` among the program's
    /// arguments (no `--` before the program) was taken for uswap's.
    #[test]
    fn a_programs_own_config_option_is_its_own() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        let program = Some(OsString::from("program's"));
        for line in [
            &["/bin/echo", "--config", "program's"][..],
            &["--memory-high", "1G", "prog", "--config", "program's"][..],
            &["--memory-high=1G", "prog", "--config=program's"][..],
            &["--", "prog", "--config", "program's"][..],
        ] {
            assert_ne!(config_path(&args(line)), program, "{line:?}");
        }
        assert_eq!(
            config_path(&args(&["--memory-high", "1G", "--config", "mine", "prog"])),
            Some("mine".into())
        );
        assert_eq!(
            config_path(&args(&["--compressor=zstd", "--config=mine", "prog"])),
            Some("mine".into())
        );
    }
}
