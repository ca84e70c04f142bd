"""Writes tests/data/customers.csv (committed; rerun to regenerate the same bytes):

    python tests/data/make_customers.py

300 made-up customers: numbers on very different scales (age, income, visits), two
categorical columns (city, plan), a string target that depends on all of them (churned:
yes/no) and a float one (spend). No cell is missing (tests/test_csv.py blanks some in a copy)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CITIES = ("Lille", "Lyon", "Nice", "Paris")
PLANS = ("basic", "plus", "pro")


def main() -> None:
    rng = np.random.default_rng(13)
    n = 300
    age = rng.integers(18, 80, n)
    income = rng.normal(42_000, 12_000, n).round(-2)
    visits = rng.poisson(6, n)
    city = rng.integers(0, len(CITIES), n)
    plan = rng.integers(0, len(PLANS), n)
    score = (
        (age - 48) / 12
        - (income - 42_000) / 12_000
        + np.array([1.5, -1.0, 0.5, -1.0])[city]
        + np.array([1.0, 0.0, -1.5])[plan]
    )
    churned = np.where(score + rng.normal(0, 0.5, n) > 0, "yes", "no")
    spend = (20 + 3 * visits + 15 * plan + income / 4_000 + rng.normal(0, 2, n)).round(2)
    with open(HERE / "customers.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["age", "income", "visits", "city", "plan", "spend", "churned"])
        for row in zip(age, income, visits, city, plan, spend, churned, strict=True):
            a, i, v, c, p, s, y = row
            writer.writerow([a, f"{i:.0f}", v, CITIES[c], PLANS[p], f"{s:.2f}", y])


if __name__ == "__main__":
    main()
