"""The tensor channel's one exception (re-exported as ``otpmesh.rdma.RDMAError``)."""

from __future__ import annotations

from .._core._errors import OtpmeshError


class RDMAError(OtpmeshError):
    """Raised by RDMABuffer transfers: size/dtype/shape mismatch, dropped buffer, dead owner,
    timeout, or no backend that reaches the owner."""

    # Also a malformed, forged or stale handle (docs/rdma.md); the docstring feeds docs/api.md.
