//! Plain-text tables for the command line (`hermes status`, `hermes ctl
//! list`, the drill report): every column as wide as its widest cell, so a
//! long cell never runs into the next column, and the last column is not
//! padded (no trailing blanks).

use std::fmt::Write;

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    /// Numbers.
    Right,
}

/// A table: its header, each column's alignment and minimum width, rows.
#[derive(Debug, Clone)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    min_width: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns (header, alignment).
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            header: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            min_width: vec![0; columns.len()],
            rows: Vec::new(),
        }
    }

    /// Keeps column `i` at least `width` wide (a table whose columns
    /// should not jump between runs).
    pub fn min_width(mut self, i: usize, width: usize) -> Table {
        self.min_width[i] = width;
        self
    }

    /// Adds a row; missing cells are blank, extra ones are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.header.len(), String::new());
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The header and every row, one line each, columns two spaces apart.
    pub fn render(&self) -> String {
        let n = self.header.len();
        let widths: Vec<usize> = (0..n)
            .map(|i| {
                std::iter::once(&self.header)
                    .chain(&self.rows)
                    .map(|r| r[i].chars().count())
                    .chain([self.min_width[i]])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in r.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match self.align[i] {
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if i + 1 < n {
                            line.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_numbers_line_up_right() {
        let mut t = Table::new(&[
            ("CHANNEL", Align::Left),
            ("SCORE", Align::Right),
            ("WHY", Align::Left),
        ]);
        t.row(["free-a", "0.71", "error_rate 0.40, a very long reason"]);
        t.row(["paid-with-a-long-name", "0.05", "-"]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "CHANNEL                SCORE  WHY");
        assert_eq!(
            lines[1],
            "free-a                  0.71  error_rate 0.40, a very long reason"
        );
        assert_eq!(lines[2], "paid-with-a-long-name   0.05  -");
    }

    #[test]
    fn minimum_widths_hold_and_short_rows_are_padded() {
        let mut t = Table::new(&[("A", Align::Left), ("B", Align::Left)]).min_width(0, 6);
        t.row(["x"]);
        assert_eq!(t.render(), "A       B\nx\n");
        assert!(!t.is_empty());
    }
}
