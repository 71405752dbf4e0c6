"""The one Markdown table writer of the results runners (scripts/results_*.py) and the benchmarks (benchmarks/):
rows are dicts, columns (header, row -> cell text) pairs."""


RUN_COLUMNS = [  # the columns every results table (scripts/results_*.py) shares: (header, row -> cell text)
    ("parameters", lambda r: f"{r['parameters'] / 1e6:.2f}M"),
    ("updates", lambda r: str(r["steps"])),
    ("train minutes", lambda r: f"{r['train_minutes']:.1f}"),
]


def markdown_table(rows, columns):
    """rows: dicts; columns: (header, row -> cell text) pairs -> a markdown table."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)
