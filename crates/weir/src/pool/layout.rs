//! The words that describe a pool on the command line: its name, and its
//! layout (`mirror A B mirror C D`, or single devices).

use anyhow::bail;

use super::label::COPIES_MAX;

/// `[mirror] A B [mirror C D ...]`: mirror groups, or single devices striped.
pub fn parse_layout(words: &[String]) -> anyhow::Result<Vec<Vec<String>>> {
    if words.is_empty() {
        bail!("name at least one device");
    }
    if words[0] != "mirror" {
        if let Some(word) = words.iter().find(|w| *w == "mirror") {
            bail!("{word:?} after plain devices: give every group as `mirror DEV DEV...`");
        }
        return Ok(words.iter().map(|w| vec![w.clone()]).collect());
    }
    let mut groups: Vec<Vec<String>> = Vec::new();
    for word in words {
        if word == "mirror" {
            groups.push(Vec::new());
        } else {
            groups
                .last_mut()
                .expect("starts with mirror")
                .push(word.clone());
        }
    }
    if let Some(small) = groups.iter().find(|g| g.len() < 2) {
        bail!("a mirror needs at least two devices, got {small:?}");
    }
    if groups.iter().any(|g| g.len() != groups[0].len()) {
        bail!("every mirror needs the same number of devices");
    }
    if groups[0].len() > COPIES_MAX {
        bail!(
            "a mirror of at most {COPIES_MAX} devices, got {}",
            groups[0].len()
        );
    }
    Ok(groups)
}

pub fn check_pool_name(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!("invalid pool name {name:?}: 1-64 letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn layouts_parse_as_mirrors_or_single_devices() {
        assert_eq!(
            parse_layout(&words("a b")).unwrap(),
            vec![vec!["a"], vec!["b"]]
        );
        assert_eq!(
            parse_layout(&words("mirror a b mirror c d")).unwrap(),
            vec![vec!["a", "b"], vec!["c", "d"]]
        );
        for bad in [
            "",
            "mirror a",
            "a mirror b c",
            "mirror a b mirror c d e",
            "mirror",
        ] {
            assert!(
                parse_layout(&words(bad)).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn a_mirror_wider_than_the_selector_can_weigh_is_refused() {
        let devices = |n: usize| {
            (0..n)
                .map(|i| format!("d{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert!(parse_layout(&words(&format!("mirror {}", devices(COPIES_MAX)))).is_ok());
        let err = parse_layout(&words(&format!("mirror {}", devices(COPIES_MAX + 1))))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 64"), "{err}");
    }

    #[test]
    fn pool_names_are_checked() {
        assert!(check_pool_name("tank-1.b_2").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_pool_name(bad).is_err());
        }
    }
}
