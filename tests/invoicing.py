"""A tool that needs approval, shared by the approval tests: `RAN` records every real run."""

from __future__ import annotations

from hermes_core import tool

RAN: list[str] = []


@tool(confirm=True)
def send_invoice(customer: str, amount: float) -> str:
    """Send an invoice to a customer (needs approval).

    Args:
        customer: who gets the invoice
        amount: the amount in euros
    """
    RAN.append(f"invoice {customer} {amount:g}")
    return f"invoice sent to {customer}"
