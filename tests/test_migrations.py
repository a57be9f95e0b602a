"""Upgrading a database from the release that shipped the demo shop inside the app."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

LEGACY = ("webhook_receiver_inventoryledgerentry", "webhook_receiver_orderstate")
SHOP = ("shop_inventoryledgerentry", "shop_orderstate")
BEFORE_THE_MOVE = [("webhook_receiver", "0004_admin_search_indexes")]


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def latest():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


def tables() -> set[str]:
    return set(connection.introspection.table_names())


def rows(table: str, columns: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {connection.ops.quote_name(table)} ORDER BY 1")
        return cursor.fetchall()


def put_legacy_rows() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO webhook_receiver_inventoryledgerentry "
            "(order_id, sku, delta, reason, event_key, created_at) "
            "VALUES ('ord_old', 'SKU-OLD', -3, 'reserved', 'msg_old', %s)",
            ["2026-11-01T00:00:00+00:00"],
        )
        cursor.execute(
            "INSERT INTO webhook_receiver_orderstate "
            "(order_id, status, version, event_key, updated_at) "
            "VALUES ('ord_old', 'paid', 4, 'msg_paid', %s)",
            ["2026-11-01T00:00:00+00:00"],
        )


@pytest.mark.django_db(transaction=True)
def test_an_upgraded_database_keeps_its_ledger_and_order_states_in_the_shop():
    # given: a database as 0.1.0 left it, with business rows in the app's old tables
    migrate(BEFORE_THE_MOVE)
    assert set(LEGACY) <= tables() and not set(SHOP) & tables()
    put_legacy_rows()

    # when
    migrate(latest())

    # then: the shop owns the same rows under its own table names
    assert set(SHOP) <= tables() and not set(LEGACY) & tables()
    assert rows("shop_inventoryledgerentry", "order_id, sku, delta, event_key") == [
        ("ord_old", "SKU-OLD", -3, "msg_old")
    ]
    assert rows("shop_orderstate", "order_id, status, version") == [("ord_old", "paid", 4)]
    from project.shop.models import OrderState

    assert OrderState.objects.get().version == 4  # the model reads the adopted table


@pytest.mark.django_db(transaction=True)
def test_a_host_without_the_shop_is_left_no_empty_business_tables():
    # given: the app's history up to 0.1.0, which created the demo tables
    migrate(BEFORE_THE_MOVE)

    # when: only the app is migrated (a host that never installed the shop)
    migrate([("webhook_receiver", "0005_demo_shop_moves_out")])

    # then
    assert not set(LEGACY) & tables()
    assert not set(SHOP) & tables()
    migrate(latest())
    assert set(SHOP) <= tables()


@pytest.mark.django_db(transaction=True)
def test_a_table_with_rows_is_never_dropped_even_without_the_shop():
    migrate(BEFORE_THE_MOVE)
    put_legacy_rows()

    migrate([("webhook_receiver", "0005_demo_shop_moves_out")])

    assert set(LEGACY) <= tables()  # left for its owner to adopt or drop
    migrate(latest())
    assert rows("shop_orderstate", "order_id") == [("ord_old",)]
