//! Pruning markers against a real PostgreSQL: only markers older than the
//! retention go, in bounded batches, in the background until stopped.

mod common;

use std::time::Duration;

use common::{database, marker_table};
use intake_postgres::{MarkerTable, PruneSettings, Pruner};
use sqlx::{AssertSqlSafe, PgPool};

/// Inserts a marker `id` whose `processed_at` is `age_seconds` in the past.
async fn marker_aged(pool: &PgPool, table: &MarkerTable, id: &str, age_seconds: i64) {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (consumer_group, source, partition, message_id, processed_at) \
         VALUES ('billing', 'orders', 0, $1, now() - make_interval(secs => $2))",
        table.name()
    )))
    .bind(id)
    .bind(age_seconds as f64)
    .execute(pool)
    .await
    .expect("the marker is inserted");
}

async fn remaining_ids(pool: &PgPool, table: &MarkerTable) -> Vec<String> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT message_id FROM {} ORDER BY message_id",
        table.name()
    )))
    .fetch_all(pool)
    .await
    .expect("the markers can be read")
}

#[tokio::test]
async fn pruning_never_removes_a_marker_newer_than_the_retention() {
    let Some(pool) = database("prune retention", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    let retention = Duration::from_secs(3600);
    // Ages from 0 to 2 hours, every 5 minutes, half a minute off the
    // boundary so that the time between insert and prune cannot matter.
    let mut newer = Vec::new();
    for step in 0..24 {
        let age = step * 300 + 30;
        let id = format!("{age:05}");
        marker_aged(&pool, &table, &id, age).await;
        if age < 3600 {
            newer.push(id);
        }
    }

    let deleted = table.prune(&pool, retention, 1000).await.unwrap();

    assert_eq!(remaining_ids(&pool, &table).await, newer);
    assert_eq!(deleted, 24 - newer.len() as u64);
}

#[tokio::test]
async fn one_prune_statement_deletes_at_most_its_batch() {
    let Some(pool) = database("prune batches", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    for id in 0..25 {
        marker_aged(&pool, &table, &format!("old-{id}"), 7200).await;
    }
    let retention = Duration::from_secs(3600);
    assert_eq!(table.prune(&pool, retention, 10).await.unwrap(), 10);
    assert_eq!(table.prune(&pool, retention, 10).await.unwrap(), 10);
    assert_eq!(table.prune(&pool, retention, 10).await.unwrap(), 5);
    assert_eq!(table.prune(&pool, retention, 10).await.unwrap(), 0);
}

#[tokio::test]
async fn the_pruner_deletes_old_markers_in_the_background_until_stopped() {
    let Some(pool) = database("pruner task", 4).await else {
        return;
    };
    let table = marker_table(&pool).await;
    for id in 0..25 {
        marker_aged(&pool, &table, &format!("old-{id:02}"), 7200).await;
    }
    marker_aged(&pool, &table, "recent", 60).await;

    let pruner = Pruner::spawn(
        pool.clone(),
        table.clone(),
        PruneSettings {
            retention: Duration::from_secs(3600),
            interval: Duration::from_millis(20),
            batch_size: 10,
        },
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while pruner.pruned() < 25 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(pruner.pruned(), 25);
    pruner.stop().await;

    // Stopped: a marker that ages past the retention now stays.
    marker_aged(&pool, &table, "old-after-stop", 7200).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        remaining_ids(&pool, &table).await,
        vec!["old-after-stop".to_owned(), "recent".to_owned()]
    );
}
