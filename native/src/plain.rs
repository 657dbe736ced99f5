//! A plain page's runs: `message_history/core/recall_plan.py`'s `plain_page` on rows already parsed, with no
//! Python object per row. The checks and the cuts are that function's, step for step (see its docstring):
//! no `system` row, no id twice in the page nor among the input's, `(createdAt, id)` strictly decreasing
//! newest first, then each input message placed after the rows whose key is not greater than its own.
//! Ids compare as Python compares `str`s: by code point, which is the byte order of their UTF-8.

use std::collections::HashSet;

/// One row of the page (newest first): its id, `createdAt` in ms, role and enriched JSON.
pub struct PageRow<'a> {
    pub id: &'a str,
    pub ms: i64,
    pub role: &'a str,
    pub body: Vec<u8>,
}

/// An input message's sort key: its `createdAt` in ms (None: undated, after every stored row) and its id
/// (`""` when it has none), as `rules.sort_key` orders them.
pub struct InputKey<'a> {
    pub ms: Option<i64>,
    pub id: &'a str,
}

/// The runs of `plain_page` (`len(incoming) + 1` of them, each its rows' JSON comma-joined), or None when
/// the page does not qualify.
pub fn runs(
    page: &[PageRow<'_>],
    incoming: &[InputKey<'_>],
    incoming_ids: &[&str],
) -> Option<Vec<Vec<u8>>> {
    if page.iter().any(|row| row.role == "system") {
        return None;
    }
    let mut unique: HashSet<&str> = HashSet::with_capacity(page.len());
    for row in page {
        if !unique.insert(row.id) {
            return None;
        }
    }
    if incoming_ids.iter().any(|id| unique.contains(id)) {
        return None;
    }
    // strictly decreasing (createdAt, id), newest first
    if page
        .windows(2)
        .any(|w| (w[1].ms, w[1].id) >= (w[0].ms, w[0].id))
    {
        return None;
    }
    let n = page.len();
    // chronological position k is page[n - 1 - k]; a cut is how many chronological rows come before an
    // input message: those whose key is not greater than its own, and never fewer than the previous cut
    // (`bisect_right(..., lo=previous)` on a sorted list)
    let mut bounds = Vec::with_capacity(incoming.len() + 2);
    bounds.push(0);
    let mut previous = 0;
    for key in incoming {
        let before = match key.ms {
            None => n,
            // newest first: the rows greater than the key are a prefix
            Some(ms) => n - page.partition_point(|row| (row.ms, row.id) > (ms, key.id)),
        };
        previous = previous.max(before);
        bounds.push(previous);
    }
    bounds.push(n);
    let runs = bounds
        .windows(2)
        .map(|w| {
            let rows = &page[n - w[1]..n - w[0]]; // chronological w[0]..w[1], newest first
            let size = rows.iter().map(|row| row.body.len() + 1).sum::<usize>();
            let mut run = Vec::with_capacity(size);
            for (i, row) in rows.iter().rev().enumerate() {
                if i > 0 {
                    run.push(b',');
                }
                run.extend_from_slice(&row.body);
            }
            run
        })
        .collect();
    Some(runs)
}
