"""Markdown tables of benchmark rows, and the cell formats the sections share."""

__all__ = ["table", "human_size", "config_label", "algorithm_label"]


def table(rows, columns):
    """A Markdown table: one line per row, one cell per ``(header, format)`` column.

    Parameters
    ----------
    rows : iterable
        The rows, whatever ``format`` reads.
    columns : list of (str, callable)
        Each column's header and the function that turns a row into its cell.

    Returns
    -------
    str
        The table's lines.
    """
    head = "| " + " | ".join(name for name, _ in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(r) for _, fmt in columns) + " |" for r in rows]
    return "\n".join([head, rule] + body)


def human_size(nbytes):
    """``nbytes`` in B, KB, MB or GB (powers of 1024), without decimals."""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}"
        nbytes /= 1024


def config_label(row):
    """A row's codec as Markdown: its id in backticks, then the parameters that are set."""
    cfg = dict(row["config"]) if row.get("config") else {"id": row["codec"]}
    name = cfg.pop("id")
    extra = ", ".join(f"{k}={v}" for k, v in cfg.items() if v is not None)
    return f"`{name}`" + (f" ({extra})" if extra else "")


def algorithm_label(row):
    """The allreduce benchmark's label of a row's algorithm (``auto→direct /seg 1MB``)."""
    from ccl.bench.allreduce import algorithm_label as label
    return label(row)
