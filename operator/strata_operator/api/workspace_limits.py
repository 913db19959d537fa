"""The limits a workspace pod keeps whatever its template says: Kubernetes quantities, the workspace
container's resources merged from the defaults and the template's, and the size of a template's emptyDir
volumes (pure).

Light (no pydantic): the pod builder uses it, and the workspace agent imports the builder's module.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

CONTAINER = "pulumi"  # PKO's name for the workspace container: podTemplate containers of that name merge into it
DEFAULT_RESOURCES = {"requests": {"cpu": "100m", "memory": "192Mi"}, "limits": {"memory": "2Gi"}}
# A template's emptyDir without a sizeLimit gets this one (the kubelet evicts a pod whose emptyDir outgrows
# its limit: without one a pod could fill its node's disk); a sizeLimit above the cap is refused.
TEMPLATE_EMPTY_DIR_SIZE = "1Gi"
TEMPLATE_EMPTY_DIR_CAP = "4Gi"

_QUANTITY = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?\d+)?$")
_MULTIPLIERS = {"Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
                "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60, "n": Decimal("1e-9"), "u": Decimal("1e-6"),
                "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
                "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18")}


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity (`500m`, `512Mi`, `2Gi`, `1e3`, or a YAML number) as a number; ValueError if it is
    not one."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(value)
    found = _QUANTITY.match(str(value))
    if found is None:
        raise ValueError(value)
    number, suffix = found.group(1), found.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _MULTIPLIERS[suffix]


def resource_layers(template: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """What sets the workspace container's resources, in merge order, each with its path under the template's
    spec: `resources`, then those of each podTemplate container named `pulumi`."""
    containers = ((template.get("podTemplate") or {}).get("spec") or {}).get("containers") or []
    return [("resources", template.get("resources") or {}),
            *((f"podTemplate.spec.containers[{i}].resources", container.get("resources") or {})
              for i, container in enumerate(containers) if container.get("name") == CONTAINER)]


def merged_resources(*layers: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """DEFAULT_RESOURCES with each layer's requests and limits over them, key by key (a template that sets
    only requests keeps the memory limit). Where that leaves a request above its limit, the side the
    template did not set follows the one it did, as Kubernetes defaults a missing request to its limit:
    a template's request above the default limit raises the limit to it, a template's limit below the
    default request lowers the request. Both set so by the template: refused before (template_issues)."""
    requests, limits = dict(DEFAULT_RESOURCES["requests"]), dict(DEFAULT_RESOURCES["limits"])
    theirs_requested: set[str] = set()
    theirs_limited: set[str] = set()
    for layer in layers:
        requests.update((layer or {}).get("requests") or {})
        limits.update((layer or {}).get("limits") or {})
        theirs_requested.update((layer or {}).get("requests") or {})
        theirs_limited.update((layer or {}).get("limits") or {})
    for name in set(requests) & set(limits):
        if parse_quantity(requests[name]) > parse_quantity(limits[name]):
            if name not in theirs_requested:
                requests[name] = limits[name]
            elif name not in theirs_limited:
                limits[name] = requests[name]
    return {"requests": requests, "limits": limits}


def sized_volume(volume: Mapping[str, Any]) -> dict[str, Any]:
    """A template's volume as the pod gets it: an emptyDir (or a volume naming no source, which the API
    server makes one) without a sizeLimit gets TEMPLATE_EMPTY_DIR_SIZE."""
    if any(key != "name" and key != "emptyDir" for key in volume):
        return dict(volume)
    empty_dir = dict(volume.get("emptyDir") or {})
    return {**volume, "emptyDir": {**empty_dir, "sizeLimit": empty_dir.get("sizeLimit") or TEMPLATE_EMPTY_DIR_SIZE}}
