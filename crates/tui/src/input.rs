//! The multi-line input box: text with a cursor, and the history of sent inputs.
//!
//! Up and Down move between lines of a multi-line input, and through the history from its
//! first and last line (as a shell does for one-line inputs). Left, Right, Backspace and
//! Delete step over a character as a person sees it (a grapheme cluster), not a code point.

use unicode_segmentation::UnicodeSegmentation;

/// The input being typed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    text: String,
    /// Byte offset of the cursor in `text` (always on a char boundary).
    cursor: usize,
    history: Vec<String>,
    /// Where Up/Down stand in `history` (`None`: on the draft).
    browsing: Option<usize>,
    /// What was typed before browsing the history.
    draft: String,
}

impl Input {
    /// The text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether nothing is typed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The cursor as `(line, column in chars)`.
    pub fn cursor(&self) -> (usize, usize) {
        let before = &self.text[..self.cursor];
        let line = before.matches('\n').count();
        let col = before
            .rsplit('\n')
            .next()
            .map(|l| l.chars().count())
            .unwrap_or(0);
        (line, col)
    }

    /// Inserts a character at the cursor.
    pub fn insert(&mut self, c: char) {
        self.text.insert(self.cursor, c);
        self.cursor += c.len_utf8();
    }

    /// Inserts pasted text at the cursor (`\r\n` and `\r` read as new lines).
    pub fn paste(&mut self, text: &str) {
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.text.insert_str(self.cursor, &text);
        self.cursor += text.len();
    }

    /// Sets the whole text, the cursor at its end.
    pub fn set(&mut self, text: &str) {
        self.text = text.to_string();
        self.cursor = self.text.len();
    }

    /// Where the character before the cursor starts: a character as a person sees it (a
    /// grapheme cluster: `é` written with a combining accent, a flag, a family emoji joined by
    /// ZWJs), never the middle of one.
    fn previous(&self) -> Option<usize> {
        self.text[..self.cursor]
            .grapheme_indices(true)
            .next_back()
            .map(|(i, _)| i)
    }

    /// Where the character after the cursor ends (see [`Input::previous`]).
    fn next(&self) -> Option<usize> {
        self.text[self.cursor..]
            .graphemes(true)
            .next()
            .map(|g| self.cursor + g.len())
    }

    /// Deletes the character before the cursor.
    pub fn backspace(&mut self) {
        if let Some(start) = self.previous() {
            self.text.replace_range(start..self.cursor, "");
            self.cursor = start;
        }
    }

    /// Deletes the character under the cursor.
    pub fn delete(&mut self) {
        if let Some(end) = self.next() {
            self.text.replace_range(self.cursor..end, "");
        }
    }

    /// Moves the cursor one character left.
    pub fn left(&mut self) {
        if let Some(start) = self.previous() {
            self.cursor = start;
        }
    }

    /// Moves the cursor one character right.
    pub fn right(&mut self) {
        if let Some(end) = self.next() {
            self.cursor = end;
        }
    }

    /// Moves the cursor to the start of its line.
    pub fn home(&mut self) {
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }

    /// Moves the cursor to the end of its line.
    pub fn end(&mut self) {
        self.cursor = self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i);
    }

    /// Up: the line above, or the previous history entry from the first line.
    pub fn up(&mut self) {
        let (line, col) = self.cursor();
        if line > 0 {
            self.move_to_line(line - 1, col);
            return;
        }
        let next = match self.browsing {
            None if self.history.is_empty() => return,
            None => {
                self.draft = self.text.clone();
                self.history.len() - 1
            }
            Some(0) => return,
            Some(i) => i - 1,
        };
        self.browsing = Some(next);
        self.set(&self.history[next].clone());
    }

    /// Down: the line below, or the next history entry (then the draft) from the last line.
    pub fn down(&mut self) {
        let (line, col) = self.cursor();
        if line + 1 < self.text.split('\n').count() {
            self.move_to_line(line + 1, col);
            return;
        }
        match self.browsing {
            None => {}
            Some(i) if i + 1 < self.history.len() => {
                self.browsing = Some(i + 1);
                self.set(&self.history[i + 1].clone());
            }
            Some(_) => {
                self.browsing = None;
                let draft = std::mem::take(&mut self.draft);
                self.set(&draft);
            }
        }
    }

    fn move_to_line(&mut self, target: usize, col: usize) {
        let mut offset = 0;
        for (i, line) in self.text.split('\n').enumerate() {
            if i == target {
                let within: usize = line.chars().take(col).map(char::len_utf8).sum();
                self.cursor = offset + within;
                return;
            }
            offset += line.len() + 1;
        }
    }

    /// Clears the text (Esc).
    pub fn clear(&mut self) {
        self.text.clear();
        self.cursor = 0;
        self.browsing = None;
    }

    /// Takes the text to send, and keeps it in the history.
    pub fn take(&mut self) -> String {
        let text = std::mem::take(&mut self.text);
        self.cursor = 0;
        self.browsing = None;
        self.draft.clear();
        if !text.trim().is_empty() && self.history.last() != Some(&text) {
            self.history.push(text.clone());
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(s: &str) -> Input {
        let mut i = Input::default();
        for c in s.chars() {
            i.insert(c);
        }
        i
    }

    /// A family emoji (four people joined by ZWJs), a flag and an accent written as a
    /// combining mark are each one step and one deletion: typing after a step never splits one.
    #[test]
    fn the_cursor_steps_over_whole_characters_as_seen() {
        let family = "\u{1f468}\u{200d}\u{1f469}\u{200d}\u{1f467}\u{200d}\u{1f466}";
        let mut i = typed(&format!("a{family}b"));
        i.left();
        i.left();
        i.insert('X');
        assert_eq!(i.text(), format!("aX{family}b"));
        i.right();
        i.backspace();
        assert_eq!(i.text(), "aXb");
        let mut i = typed("e\u{301}\u{1f1eb}\u{1f1f7}");
        i.left();
        i.left();
        i.delete();
        assert_eq!(i.text(), "\u{1f1eb}\u{1f1f7}");
        i.right();
        assert_eq!(i.cursor(), (0, 2));
    }

    #[test]
    fn history_walks_back_and_returns_to_the_draft() {
        let mut i = typed("first");
        i.take();
        i.paste("second");
        i.take();
        i.paste("draft");
        i.up();
        assert_eq!(i.text(), "second");
        i.up();
        assert_eq!(i.text(), "first");
        i.up();
        assert_eq!(i.text(), "first");
        i.down();
        assert_eq!(i.text(), "second");
        i.down();
        assert_eq!(i.text(), "draft");
    }

    #[test]
    fn up_and_down_move_between_lines_first() {
        let mut i = typed("old");
        i.take();
        i.paste("ab\r\ncdef");
        assert_eq!(i.cursor(), (1, 4));
        i.up();
        assert_eq!(i.cursor(), (0, 2));
        assert_eq!(i.text(), "ab\ncdef");
        i.up();
        assert_eq!(i.text(), "old");
    }

    #[test]
    fn editing_respects_multibyte_characters() {
        let mut i = typed("héllo");
        i.left();
        i.left();
        i.left();
        i.backspace();
        assert_eq!(i.text(), "hllo");
        i.insert('é');
        i.end();
        i.insert('!');
        assert_eq!(i.text(), "héllo!");
        i.home();
        i.delete();
        assert_eq!(i.text(), "éllo!");
    }
}
