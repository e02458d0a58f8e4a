//! Plain-text tables for the command line (`hermes status`, `hermes ctl
//! list`, the drill report), rendered by `comfy-table` without borders:
//! every column as wide as its widest cell (by display width), two spaces
//! between columns, and no trailing blanks.

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
        use comfy_table::{CellAlignment, ColumnConstraint, Width};
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::NOTHING)
            .set_header(&self.header)
            .add_rows(&self.rows);
        let last = self.header.len().saturating_sub(1);
        for (i, column) in t.column_iter_mut().enumerate() {
            // One space either side of every inner edge: two between columns.
            column.set_padding((u16::from(i > 0), u16::from(i < last)));
            column.set_cell_alignment(match self.align[i] {
                Align::Left => CellAlignment::Left,
                Align::Right => CellAlignment::Right,
            });
            if self.min_width[i] > 0 {
                // The boundary counts the padding too.
                let w = u16::try_from(self.min_width[i])
                    .unwrap_or(u16::MAX)
                    .saturating_add(column.padding_width());
                column.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(w)));
            }
        }
        let mut out = String::new();
        for line in t.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
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

    #[test]
    fn wide_characters_take_their_display_width() {
        let mut t = Table::new(&[("CHANNEL", Align::Left), ("W", Align::Right)]);
        t.row(["免费-a", "0.5"]);
        t.row(["paid-a", "1.0"]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        // "免费" is four columns wide: "免费-a" is six, as "paid-a".
        assert_eq!(lines[1], "免费-a   0.5");
        assert_eq!(lines[2], "paid-a   1.0");
    }
}
