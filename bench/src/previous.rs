//! The figures of the previous `make bench` (the bench/RESULTS.md this run
//! replaces), read off its Markdown tables, to print beside the new ones.

pub struct Previous {
    text: String,
    /// The line that says when and how fast it was produced.
    pub produced: Option<String>,
}

/// A table: its header cells and its rows' cells.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

fn cells(line: &str) -> Vec<String> {
    line.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect()
}

/// The leading number of a cell (`**6.30x**`, `181.1 us`, `28.6 / 59.4`).
fn number(cell: &str) -> Option<f64> {
    let cell = cell.trim_start_matches('*');
    let end = cell.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(cell.len());
    cell[..end].parse().ok()
}

impl Previous {
    pub fn read(path: &str) -> Option<Previous> {
        let text = std::fs::read_to_string(path).ok()?;
        let produced = text.lines().find(|l| l.starts_with("Produced by")).map(str::to_string);
        Some(Previous { text, produced })
    }

    /// The first table after the heading that contains `heading`.
    fn table(&self, heading: &str) -> Option<Table> {
        let mut lines = self.text.lines().skip_while(|l| !(l.starts_with('#') && l.contains(heading))).skip(1);
        let header = cells(lines.by_ref().find(|l| l.starts_with('|'))?);
        let rows = lines.skip(1).take_while(|l| l.starts_with('|')).map(cells).collect();
        Some(Table { header, rows })
    }

    /// The number in the row named `row`, column starting with `column`.
    fn value(&self, heading: &str, row: &str, column: &str) -> Option<f64> {
        let table = self.table(heading)?;
        let col = table.header.iter().position(|h| h.starts_with(column))?;
        let row = table.rows.iter().find(|r| r.first().is_some_and(|c| c == row))?;
        number(row.get(col)?)
    }

    /// Component / native median of the full protocol on `path`.
    pub fn protocol_ratio(&self, path: &str) -> Option<f64> {
        let heading = "Per request, full protocol";
        self.value(heading, path, "component / native").or_else(|| self.value(heading, path, "ratio"))
    }

    /// The native protocol's median on `path` (us).
    fn native_median(&self, path: &str) -> Option<f64> {
        self.value("Per request, full protocol", path, "native")
    }

    /// What the tower layer added over the bare axum app, over the native
    /// protocol's median (read off the older table when it had no ratio).
    pub fn axum_ratio(&self, path: &str) -> Option<f64> {
        let heading = "axum end to end";
        self.value(heading, path, "layer adds / native")
            .or_else(|| Some(self.value(heading, path, "the layer adds")? / self.native_median(path)?))
    }

    /// The same ratio with every thread on one CPU.
    pub fn axum_one_cpu_ratio(&self, path: &str) -> Option<f64> {
        self.value("axum on one CPU", path, "layer adds / native")
    }

    /// What the tower layer added over the bare axum app on PostgreSQL, over
    /// the time of its batches on the request path.
    pub fn axum_postgres_ratio(&self, path: &str) -> Option<f64> {
        self.value("axum on PostgreSQL", path, "adds / batches")
    }
}
