//! Lists read from the API server a page at a time, so that a fleet's worth of objects is
//! never parsed or held at once.
//!
//! ```ignore
//! let mut pages = Pages::default();
//! while let Some(lp) = pages.next_params() {
//!     let page = api.list(&lp).await?;
//!     // ... each item of page.items ...
//!     pages.read(page.metadata.continue_);
//! }
//! ```

use kube::api::ListParams;

/// Objects asked for in one page.
pub const PAGE: u32 = 500;

/// Where a paged list stands: the next page's continue token, or done.
#[derive(Debug, Default)]
pub struct Pages {
    token: Option<String>,
    done: bool,
}

impl Pages {
    /// The parameters of the next page to read; None once the last page was read.
    pub fn next_params(&self) -> Option<ListParams> {
        if self.done {
            return None;
        }
        let lp = ListParams::default().limit(PAGE);
        Some(match &self.token {
            Some(t) => lp.continue_token(t),
            None => lp,
        })
    }

    /// Records the continue token of the page just read (none or empty: it was the last).
    pub fn read(&mut self, token: Option<String>) {
        self.token = token.filter(|t| !t.is_empty());
        self.done = self.token.is_none();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_the_continue_token_until_there_is_none() {
        let mut pages = Pages::default();
        let first = pages.next_params().expect("a first page");
        assert_eq!((first.limit, first.continue_token), (Some(PAGE), None));
        pages.read(Some("t1".into()));
        let second = pages.next_params().expect("a second page");
        assert_eq!(second.continue_token.as_deref(), Some("t1"));
        pages.read(Some(String::new()));
        assert!(pages.next_params().is_none());
    }
}
