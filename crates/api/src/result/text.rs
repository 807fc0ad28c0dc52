//! Texts of a result cut to the length a document allows.

/// `message` cut to at most `max` bytes on a character boundary, with an ellipsis when cut.
pub(super) fn cut(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}
