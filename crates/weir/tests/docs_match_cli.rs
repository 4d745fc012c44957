//! The documentation and the command line cannot drift apart:
//! - docs/configuration.md's command reference and man/ are what
//!   `weir reference` generates from the clap definitions now;
//! - every `weir ...` command in the README's and docs' shell blocks parses,
//!   and every `weir ...` in their text names real subcommands and flags;
//! - every command is described in README.md or docs/operations.md;
//! - every config-file key is in docs/configuration.md's example, and the
//!   example loads.

use std::path::{Path, PathBuf};

use clap::{CommandFactory, Parser};
use regex::Regex;
use weir::cli::reference::{self, GENERATED_MARK};
use weir::cli::Cli;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(relative: &str) -> String {
    let path = root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// README.md and every page under docs/.
fn documents() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|n| n.ends_with(".md"))
        .collect();
    pages.sort();
    names.extend(pages);
    names.into_iter().map(|n| (n.clone(), read(&n))).collect()
}

const REGENERATE: &str = "regenerate with scripts/reference.sh";

#[test]
fn the_command_reference_is_generated_from_clap() {
    let page = read("docs/configuration.md");
    let (_, generated) = page
        .split_once(GENERATED_MARK)
        .expect("docs/configuration.md has the generated-part mark");
    assert!(
        generated.trim() == reference::markdown().trim(),
        "docs/configuration.md's command reference differs from clap; {REGENERATE}"
    );
}

#[test]
fn the_man_pages_are_generated_from_clap() {
    let pages = reference::man_pages().unwrap();
    let mut committed: Vec<String> = std::fs::read_dir(root().join("man"))
        .expect("man/ exists")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    committed.sort();
    let mut expected: Vec<String> = pages.iter().map(|p| p.0.clone()).collect();
    expected.sort();
    assert_eq!(committed, expected, "man pages; {REGENERATE}");
    for (name, page) in pages {
        let on_disk = std::fs::read(root().join("man").join(&name)).unwrap();
        assert!(
            on_disk == page,
            "man/{name} differs from clap; {REGENERATE}"
        );
    }
}

/// A documented command line as words, synopsis notation resolved: optional
/// `[...]` parts dropped, `a|b` alternatives reduced to the first, `X...`
/// to `X`. Quoted text is left as it is.
fn words_of(line: &str) -> Vec<String> {
    let mut plain = String::new();
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => depth -= 1,
            (None, _) => {}
        }
        // Brackets outside quotes are synopsis, not part of the command.
        let synopsis_bracket = quote.is_none() && matches!(c, '[' | ']');
        if depth == 0 && !synopsis_bracket {
            plain.push(c);
        }
    }
    shlex::split(&plain)
        .unwrap_or_else(|| panic!("cannot split {line:?}"))
        .into_iter()
        .map(|w| {
            if w.contains('|') && !w.contains('=') && !w.starts_with('|') {
                w.split('|').next().unwrap().to_string()
            } else {
                w
            }
        })
        .map(|w| w.trim_end_matches("...").to_string())
        .filter(|w| !w.is_empty())
        .collect()
}

/// `weir ...` lines of the shell blocks, continuation lines joined and
/// comments dropped.
fn shell_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_shell = matches!(line.trim(), "```sh" | "```bash" | "```shell");
            continue;
        }
        if !in_shell {
            continue;
        }
        let line = match line.find(" #") {
            Some(at) if !line[..at].contains('\'') || line[..at].matches('\'').count() % 2 == 0 => {
                &line[..at]
            }
            _ => line,
        };
        pending.push_str(line.trim_end_matches('\\').trim());
        pending.push(' ');
        if line.trim_end().ends_with('\\') {
            continue;
        }
        let command = pending.trim().to_string();
        pending.clear();
        let command = command
            .strip_prefix("cargo run --release -- ")
            .map(|rest| format!("weir {rest}"))
            .unwrap_or(command);
        if command.starts_with("weir ") {
            commands.push(command);
        }
    }
    commands
}

#[test]
fn every_shell_command_in_the_docs_parses() {
    let mut failures = Vec::new();
    let mut count = 0;
    for (name, text) in documents() {
        for command in shell_commands(&text) {
            count += 1;
            if let Err(err) = Cli::try_parse_from(words_of(&command)) {
                failures.push(format!("{name}: {command}\n  {}", err.kind()));
            }
        }
    }
    assert!(
        count >= 20,
        "found only {count} commands: is the scan broken?"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The subcommand a list of words names (hidden ones too), and the words
/// left after it.
fn resolve(words: &[String]) -> Result<(Vec<String>, clap::Command, &[String]), String> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut path: Vec<String> = Vec::new();
    let mut rest = &words[1..];
    while let Some(sub) = rest.first().and_then(|w| cmd.find_subcommand(w).cloned()) {
        path.push(rest[0].clone());
        rest = &rest[1..];
        cmd = sub;
    }
    if cmd.has_subcommands() && !rest.is_empty() && !rest[0].starts_with('-') {
        return Err(format!(
            "no subcommand {:?} of `weir {}`",
            rest[0],
            path.join(" ")
        ));
    }
    Ok((path, cmd, rest))
}

#[test]
fn every_weir_command_in_the_docs_text_names_real_flags() {
    let span = Regex::new(r"`(weir [^`]+)`").unwrap();
    let mut failures = Vec::new();
    for (name, text) in documents() {
        let flat = text.replace('\n', " ");
        for found in span.captures_iter(&flat) {
            let command = &found[1];
            let words = words_of(command);
            let (path, cmd, rest) = match resolve(&words) {
                Ok(resolved) => resolved,
                Err(why) => {
                    failures.push(format!("{name}: `{command}`: {why}"));
                    continue;
                }
            };
            for word in rest.iter().filter(|w| w.starts_with("--")) {
                let flag = word[2..].split('=').next().unwrap();
                if !cmd.get_arguments().any(|a| a.get_long() == Some(flag)) && flag != "help" {
                    failures.push(format!(
                        "{name}: `{command}`: `weir {}` has no --{flag}",
                        path.join(" ")
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_command_is_described_for_users() {
    let described =
        format!("{}\n{}", read("README.md"), read("docs/operations.md")).replace('\n', " ");
    let missing: Vec<String> = reference::commands()
        .into_iter()
        .filter(|(path, cmd)| !path.is_empty() && !cmd.has_subcommands())
        .map(|(path, _)| format!("weir {}", path.join(" ")))
        .filter(|name| !described.contains(name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "not in README.md or docs/operations.md: {missing:?}"
    );
}

#[test]
fn every_config_key_is_in_the_documented_example_and_it_loads() {
    let page = read("docs/configuration.md");
    let example = page
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/configuration.md has a TOML example");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weir.toml");
    std::fs::write(&path, example).unwrap();
    let args = weir::config::ServeArgs {
        config: Some(path),
        ..Default::default()
    };
    if let Err(err) = weir::config::ServeConfig::resolve(&args) {
        // Devices in the example need not exist here; the keys must parse.
        let text = format!("{err:#}");
        assert!(
            !text.contains("unknown field") && !text.contains("invalid"),
            "the documented example does not load: {text}"
        );
    }
    let serve = reference::commands()
        .into_iter()
        .find(|(p, _)| *p == ["serve"])
        .unwrap()
        .1;
    for arg in serve.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "config" | "help") {
            continue;
        }
        let key = long.replace('-', "_");
        let key = if key == "export" || key == "volume" {
            format!("[[{key}]]")
        } else {
            format!("{key} =")
        };
        assert!(
            example.contains(&key),
            "--{long} has no key in docs/configuration.md's example ({key})"
        );
    }
}

#[test]
fn the_grafana_dashboard_uses_only_metrics_weir_reports() {
    let dashboard = read("dist/grafana/weir.json");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("valid JSON");
    assert!(parsed["panels"].as_array().is_some_and(|p| !p.is_empty()));
    let families: Vec<&str> = weir::metrics::family_names().collect();
    let mut used = 0;
    for (at, _) in dashboard.match_indices("weir_") {
        let name: String = dashboard[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        assert!(
            families.contains(&family),
            "the dashboard uses {name}, which weir does not report"
        );
        used += 1;
    }
    assert!(used >= 10, "the dashboard shows weir's metrics");
}
