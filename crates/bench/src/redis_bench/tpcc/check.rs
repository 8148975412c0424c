//! What must hold of a TPC-C-like run's state, read directly from Redis after it: each
//! district's order ids dense and as many as its committed New-Orders, the totals equal to the
//! payments, every order with its lines, stock in range, no lock left held.

use std::sync::atomic::Ordering;

use pmnet_redis::resp::{SyncClient, Value};

use super::{
    customer_key, district_key, line_key, lock_key, next_id_key, order_key, record_field,
    stock_key, warehouse_key, Tpcc, CHECKED_CUSTOMERS, CHECKED_ORDERS, DISTRICTS,
};
use crate::redis_bench::conn::command;
use crate::redis_bench::workloads::{batched, int_of, spread, Check};

impl Tpcc {
    pub(super) fn check_state(
        &self,
        redis: &mut SyncClient,
        check: &mut Check,
    ) -> Result<(), String> {
        let districts: Vec<(u32, u32)> = self.districts().collect();
        let rows = batched(
            redis,
            districts
                .iter()
                .flat_map(|&(w, d)| {
                    [
                        command!["GET", next_id_key(w, d)],
                        command!["HGET", district_key(w, d), "ytd"],
                    ]
                })
                .collect(),
        )?;
        let mut wrong_ids = Vec::new();
        let mut wrong_ytd = 0;
        let mut next_ids = Vec::with_capacity(districts.len());
        for (&(w, d), row) in districts.iter().zip(rows.chunks(2)) {
            let next = row.first().and_then(int_of).unwrap_or(-1);
            let index = Self::district_index(w, d);
            let committed = self.new_orders[index].load(Ordering::Relaxed) as i64;
            if next - 1 != committed && wrong_ids.len() < 5 {
                wrong_ids.push(format!("{w}/{d}: next_o_id {next}, {committed} committed"));
            }
            let paid = self.paid[index].load(Ordering::Relaxed) as i64;
            wrong_ytd += usize::from(row.get(1).and_then(int_of) != Some(paid));
            next_ids.push(next.max(1));
        }
        check.expect(
            wrong_ids.is_empty(),
            format!(
                "each of {} districts' next_o_id is 1 + the New-Orders committed in it",
                districts.len()
            ),
            format!(
                "districts' next order ids disagree: {}",
                wrong_ids.join("; ")
            ),
        );
        check.expect(
            wrong_ytd == 0,
            "each district's ytd is the sum of its payments",
            format!("{wrong_ytd} districts' ytd differ from their payments"),
        );
        let per_district = (CHECKED_ORDERS / districts.len().max(1) as u64).max(1) as i64;
        let mut orders = Vec::new();
        for (&(w, d), &next) in districts.iter().zip(&next_ids) {
            for o in (next - per_district).max(1)..next {
                orders.push((w, d, o));
            }
        }
        let rows = batched(
            redis,
            orders
                .iter()
                .map(|&(w, d, o)| command!["GET", order_key(w, d, o)])
                .collect(),
        )?;
        let mut gaps = Vec::new();
        let mut line_checks = Vec::new();
        for (&(w, d, o), row) in orders.iter().zip(rows) {
            let order = match &row {
                Value::Bulk(Some(order)) => order.as_slice(),
                Value::Bulk(None) => b"",
                other => return Err(format!("GET order answered {other:?}")),
            };
            let lines = record_field(order, "ol_cnt").unwrap_or(0);
            if record_field(order, "o_id") != Some(o) || !(5..=15).contains(&lines) {
                if gaps.len() < 5 {
                    gaps.push(format!("{w}/{d}/{o}"));
                }
                continue;
            }
            line_checks.push(command![
                "EXISTS",
                line_key(w, d, o, 1),
                line_key(w, d, o, lines)
            ]);
        }
        check.expect(
            gaps.is_empty(),
            format!(
                "order ids dense, no gaps or duplicates: {} orders read back, each with its id",
                orders.len()
            ),
            format!("orders missing or with another id: {}", gaps.join(", ")),
        );
        let lines = batched(redis, line_checks)?;
        let short = lines
            .iter()
            .filter(|reply| int_of(reply) != Some(2))
            .count();
        check.expect(
            short == 0,
            "every order read back has its first and last lines",
            format!("{short} orders miss order lines"),
        );
        let ytd = batched(
            redis,
            (1..=self.warehouses)
                .map(|w| command!["HGET", warehouse_key(w), "ytd"])
                .collect(),
        )?;
        let mut wrong_warehouses = 0;
        for (w, reply) in (1..=self.warehouses).zip(&ytd) {
            let paid: u64 = (1..=DISTRICTS)
                .map(|d| self.paid[Self::district_index(w, d)].load(Ordering::Relaxed))
                .sum();
            wrong_warehouses += usize::from(int_of(reply) != Some(paid as i64));
        }
        check.expect(
            wrong_warehouses == 0,
            "each warehouse's ytd is the sum of its payments",
            format!("{wrong_warehouses} warehouses' ytd differ from their payments"),
        );
        let customers = districts.len() as u64 * self.customers;
        if customers <= CHECKED_CUSTOMERS {
            let counts = batched(
                redis,
                districts
                    .iter()
                    .flat_map(|&(w, d)| {
                        (1..=self.customers)
                            .map(move |c| command!["HGET", customer_key(w, d, c), "payment_cnt"])
                    })
                    .collect(),
            )?;
            let total: i64 = counts.iter().filter_map(int_of).sum();
            let payments = self.payments.load(Ordering::Relaxed) as i64;
            check.expect(
                total == payments,
                format!("the customers' payment counts add up to the {payments} payments"),
                format!("the customers' payment counts add up to {total}, not {payments}"),
            );
        }
        let stock: Vec<(u32, u64)> = (1..=self.warehouses)
            .flat_map(|w| {
                spread(self.items, 2000)
                    .into_iter()
                    .map(move |i| (w, i + 1))
            })
            .collect();
        let quantities = batched(
            redis,
            stock
                .iter()
                .map(|&(w, i)| command!["GET", stock_key(w, i)])
                .collect(),
        )?;
        let out_of_range = quantities
            .iter()
            .filter(|reply| !int_of(reply).is_some_and(|q| (10..=100).contains(&q)))
            .count();
        check.expect(
            out_of_range == 0,
            format!("{} stock quantities within 10..=100", stock.len()),
            format!("{out_of_range} stock quantities outside 10..=100"),
        );
        let held = batched(
            redis,
            districts
                .iter()
                .map(|&(w, d)| command!["EXISTS", lock_key(w, d)])
                .collect(),
        )?;
        let held = held.iter().filter(|reply| int_of(reply) != Some(0)).count();
        check.expect(
            held == 0,
            "no district lock left held",
            format!("{held} district locks left held"),
        );
        Ok(())
    }
}
