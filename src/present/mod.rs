//! What people read, in one style: the command line's plain-text tables
//! (`hermes status`, `hermes ctl list`, the drill report), a channel's
//! signals as a phrase, and the self-contained HTML page the drill
//! timeline and the weekly channel report are written as.

mod table;

pub use table::{Align, Table};

use maud::{html, Markup, PreEscaped, DOCTYPE};

/// A self-contained page (the drill timeline, the weekly channel report):
/// a title, its style sheet and its body, one line.
pub fn html_page(title: &str, style: &str, body: Markup) -> String {
    let page = html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (PreEscaped(style)) }
            }
            body { (body) }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}

/// Signals and their contributions, for people (`-` when none).
pub fn fmt_signals(s: &[(String, f64)]) -> String {
    if s.is_empty() {
        return "-".into();
    }
    s.iter()
        .map(|(k, c)| format!("{k} {c:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}
