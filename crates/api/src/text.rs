//! Texts cut to the length an object or a message allows, always on a character boundary:
//! the one rule every writer of a bounded text uses.

/// The longest start of `text` of at most `max` bytes that ends on a character boundary.
pub fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `max` bytes, the cut marked with `...`.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    format!("{}...", prefix(text, max.saturating_sub(3)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_splits_a_character_and_stays_within_the_bound() {
        let text = "é".repeat(10);
        for max in 0..=text.len() + 1 {
            let start = prefix(&text, max);
            assert!(start.len() <= max && text.starts_with(start), "{max}");
            let cut = cut(&text, max.max(3));
            assert!(cut.len() <= max.max(3), "{max}: {cut}");
        }
        assert_eq!(cut("short", 5), "short");
        assert_eq!(cut("longer", 5), "lo...");
        assert_eq!(prefix("é", 1), "");
    }
}
