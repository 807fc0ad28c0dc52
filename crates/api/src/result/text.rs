//! Texts of a result cut to the length a document allows.

/// `message` cut to at most `max` bytes on a character boundary, with an ellipsis when cut.
pub(super) fn cut(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    format!("{}…", crate::text::prefix(message, max))
}
