//! Recording terminal rows on PostgreSQL ([`Ledger::record_terminals`]): a plain insert of
//! the batch under a savepoint, and, should any child have a stored row, the locked read and
//! merge sled's ledger makes. The commit around it (staged writes, the tenure check) is
//! `commit`'s.

use super::*;

/// Terminal rows' keys and stored values, each child once (a second row of one in a batch is
/// decided by the merge of [`record_rows`]).
pub(super) fn encode_terminals(rows: &[ChildRow]) -> Result<(Vec<Key>, Vec<Vec<u8>>), LedgerError> {
    let mut seen: HashSet<Vec<u8>> = HashSet::with_capacity(rows.len());
    let (mut keys, mut values) = (Vec::with_capacity(rows.len()), Vec::with_capacity(rows.len()));
    for row in rows {
        let key = row_key(&row.session_id, &row.child_id);
        if seen.insert(key.clone()) {
            values.push(encode(CHILDREN, &row.child_id, row)?);
            keys.push(key);
        }
    }
    Ok((keys, values))
}

/// Records terminal rows in `tx` ([`Ledger::record_terminals`]), given their keys and values
/// ([`encode_terminals`]): the rows as stored, in their order, and what was written.
pub(super) async fn record_rows(
    tx: &Tx<'_>,
    this: &Inner,
    rows: Vec<ChildRow>,
    (keys, values): (Vec<Key>, Vec<Vec<u8>>),
) -> Result<(Vec<ChildRow>, Vec<Change>), LedgerError> {
    let what = "recording children's rows";
    if keys.len() == rows.len() {
        // A plain insert, under a savepoint: a third cheaper than one that skips stored keys
        // (ON CONFLICT), and should any key be stored, it fails whole and is taken back.
        let sql = format!(
            "INSERT INTO {} (key, value) SELECT * FROM unnest($1::bytea[], $2::bytea[])",
            this.table(CHILDREN)
        );
        let insert = commit::prepared(tx, &sql, what).await?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&keys, &values];
        let (saved, inserted, released) = futures::join!(
            tx.batch_execute("SAVEPOINT fresh_rows"),
            tx.execute(&insert, &params),
            tx.batch_execute("RELEASE SAVEPOINT fresh_rows"),
        );
        saved.map_err(pg_error(what))?;
        match inserted {
            Ok(_) => {
                released.map_err(pg_error(what))?;
                return Ok((rows, children_written(keys, values)));
            }
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                tx.batch_execute("ROLLBACK TO SAVEPOINT fresh_rows")
                    .await
                    .map_err(pg_error(what))?;
            }
            Err(e) => return Err(pg_error(what)(e)),
        }
    }
    // Some child has a stored row (or came twice): every stored row is read under a row lock
    // and decided as sled decides them. A stored row that does not decode is overwritten by the
    // child's own, which is complete; the damaged one was quarantined when the ledger opened.
    let what = "reading children's rows";
    let sql = format!(
        "SELECT key, value FROM {} WHERE key = ANY($1) FOR UPDATE",
        this.table(CHILDREN)
    );
    let select = commit::prepared(tx, &sql, what).await?;
    let found = tx.query(&select, &[&keys]).await.map_err(pg_error(what))?;
    let current: HashMap<Vec<u8>, Vec<u8>> = found.into_iter().map(|r| (r.get(0), r.get(1))).collect();
    let (stored, writes) = merge_terminals(rows, |key| Ok(current.get(key).and_then(|v| codec::decode(v).ok())))?;
    let mut keys = Vec::with_capacity(writes.len());
    let mut values = Vec::with_capacity(writes.len());
    for (key, at) in writes {
        let row = &stored[at];
        values.push(encode(CHILDREN, &row.child_id, row)?);
        keys.push(key);
    }
    upsert(tx, this, CHILDREN, &keys, &values).await?;
    Ok((stored, children_written(keys, values)))
}

/// What a commit that wrote `keys` → `values` in the children's table stages again should it
/// fail.
fn children_written(keys: Vec<Key>, values: Vec<Vec<u8>>) -> Vec<Change> {
    keys.into_iter()
        .zip(values)
        .map(|(k, v)| (CHILDREN, k, Some(v)))
        .collect()
}
