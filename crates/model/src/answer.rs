//! What an answer that is not the API's says, in words that point at the fix: an HTML page
//! (a web server, a login page, a proxy's error page: `base_url` is wrong), a path with
//! nothing behind it, and bodies cut to a few hundred bytes so a server's whole page never
//! lands in a turn's `error`.

/// The most of a body a message quotes.
pub(crate) const EXCERPT_BYTES: usize = 300;

/// The most of an error body read: enough for any API's error object, and an error page
/// streaming without end cannot hold the request.
pub(crate) const ERROR_BODY_MAX: usize = 64 * 1024;

/// What a wrong `base_url` usually lacks.
const BASE_URL_FIX: &str = "check base_url: for an OpenAI-compatible server it usually ends \
     in /v1 (e.g. http://127.0.0.1:4000/v1)";

/// What a 404 of `/responses` may mean beside a wrong `base_url` (`api` is frozen per session).
pub(crate) const RESPONSES_FIX: &str = "; or the server does not serve the Responses API: set \
     api = \"chat\" in [model] and start a new session";

/// Whether an answer is an HTML page: labelled `text/html` (or XHTML), or a body that starts
/// with `<` whatever its label (an API's body is JSON or server-sent events, never markup).
pub(crate) fn is_html(content_type: &str, body: &[u8]) -> bool {
    let content_type = content_type.trim().to_ascii_lowercase();
    content_type.starts_with("text/html")
        || content_type.starts_with("application/xhtml")
        || body.trim_ascii_start().starts_with(b"<")
}

/// The message of an HTML answer: not the API, the fix, and the page's start.
pub(crate) fn html_message(content_type: &str, body: &[u8]) -> String {
    let label = match content_type.trim() {
        "" => String::new(),
        content_type => format!(" ({content_type})"),
    };
    let mut message = format!(
        "the answer is an HTML page{label}, so this is not an OpenAI-compatible API; {BASE_URL_FIX}"
    );
    let page = excerpt(&String::from_utf8_lossy(body));
    if !page.is_empty() {
        message.push_str("; the page starts: ");
        message.push_str(&page);
    }
    message
}

/// What a `404` or `405` with no API error message means: nothing serves the API at this
/// path. (A 404 that carries an API's error, e.g. an unknown model, is the API answering.)
pub(crate) fn no_api_here(status: u16) -> Option<String> {
    matches!(status, 404 | 405)
        .then(|| format!("no OpenAI-compatible API answers at this path; {BASE_URL_FIX}"))
}

/// `text` on one line (runs of whitespace made one space), cut to [`EXCERPT_BYTES`] at a
/// character boundary, the cut marked with the whole length.
pub(crate) fn excerpt(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    cut(&line, EXCERPT_BYTES)
}

/// `text` cut to at most `max` bytes at a character boundary, the cut marked with the whole
/// length.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_is_told_by_its_label_or_its_first_byte() {
        assert!(is_html("text/html; charset=utf-8", b""));
        assert!(is_html("", b"  \n<!DOCTYPE html><html>"));
        assert!(is_html("application/json", b"<html>"));
        assert!(!is_html("application/json", b"{\"error\":{}}"));
        assert!(!is_html("text/event-stream", b"data: {}\n\n"));
    }

    #[test]
    fn an_html_message_names_the_fix_and_quotes_a_few_hundred_bytes() {
        let page = format!("<html>\n  <body>{}</body></html>", "x".repeat(10_000));
        let message = html_message("text/html", page.as_bytes());
        assert!(
            message.contains("not an OpenAI-compatible API"),
            "{message}"
        );
        assert!(message.contains("usually ends in /v1"), "{message}");
        assert!(message.contains("<html> <body>xxx"), "{message}");
        assert!(message.len() < 600, "{} bytes: {message}", message.len());
    }

    #[test]
    fn cut_keeps_characters_whole_and_says_how_long_the_text_was() {
        assert_eq!(cut("héllo", 2), "h... (6 bytes in all)");
        assert_eq!(cut("hi", 2), "hi");
        assert_eq!(excerpt(" a\n\n b\tc "), "a b c");
    }
}
