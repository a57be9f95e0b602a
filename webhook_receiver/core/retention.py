"""Deleting old rows without one huge statement."""

from __future__ import annotations

from django.db.models import QuerySet


def delete_in_batches(queryset: QuerySet, *, batch_size: int, max_batches: int = 1000) -> int:
    """Delete the rows of ``queryset`` ``batch_size`` at a time; return how many went.

    Short statements keep locks and WAL bursts small on a busy table.
    """
    deleted = 0
    for _ in range(max_batches):
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        deleted += queryset.model.objects.filter(pk__in=ids).delete()[0]
    return deleted
