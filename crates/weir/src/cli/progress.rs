//! Progress of a command that waits for background work (`--wait`): a bar
//! with the rate's time left on a terminal (indicatif), one plain line per
//! look otherwise, for logs and scripts.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    pub fn new() -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            let style = ProgressStyle::with_template(
                "{msg:24} [{bar:32}] {percent:>3}% {pos}/{len} chunks, {eta} left",
            )
            .expect("a valid template")
            .progress_chars("=> ");
            bar.set_style(style);
            bar
        });
        Progress { bar }
    }

    /// One look: `line` is the status line; `chunks` (done, total) when known.
    pub fn show(&self, what: &str, line: &str, chunks: Option<(u64, u64)>) {
        match (&self.bar, chunks) {
            (Some(bar), Some((done, total))) => {
                bar.set_message(what.to_string());
                bar.set_length(total);
                bar.set_position(done);
            }
            (Some(bar), None) => bar.set_message(line.to_string()),
            (None, _) => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// "(DONE of TOTAL chunks)" in a status line.
pub fn chunks_in(line: &str) -> Option<(u64, u64)> {
    let inside = line.split_once('(')?.1.split_once(" chunks)")?.0;
    let (done, total) = inside.split_once(" of ")?;
    Some((done.trim().parse().ok()?, total.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::chunks_in;

    #[test]
    fn chunk_counts_are_read_from_a_status_line() {
        let line = "resilver: /srv/c.img 4.2% (10 of 240 chunks) after 3 s";
        assert_eq!(chunks_in(line), Some((10, 240)));
        assert_eq!(chunks_in("resilver: finished"), None);
    }
}
