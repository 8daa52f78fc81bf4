"""Whether a schema's `$ref`s can end: a schema that requires itself (`{"$ref": "#"}`, or an
object whose required property refers back to it) admits no finite JSON value, so the
model could never finish its answer. The grammar engine accepts such schemas; this refuses
them first.

A least fixed point over the schema's subschemas, reached by propagation from the leaves:
one is satisfiable once some value of it needs only satisfiable parts. Anything this reading
does not model counts as satisfiable (the grammar engine still judges it), so only a
reference cycle with no way out is refused.
"""

from typing import Any

from inference.errors import ProtocolError

_LOCAL_REF = "#"


def refuse_endless_refs(schema: Any, param: str) -> None:
    if isinstance(schema, dict) and _has_refs(schema) and not _satisfiable(schema):
        raise ProtocolError(
            f"{param} admits no finite JSON value: its $ref cycle has no way out (a required "
            "property, an array item or an allOf that always refers back). Make the recursive "
            "part optional.",
            param=param,
        )


def _has_refs(schema: Any) -> bool:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$ref" in node:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


class _Needs:
    """What one subschema needs: every one of `all_of`, and one of each group in `one_of`."""

    def __init__(self) -> None:
        self.pending = 0  # unmet parts of all_of
        self.groups: list[bool] = []  # per one_of group: met yet


def _satisfiable(root: dict) -> bool:
    """Worklist propagation from the leaves, linear in the schema's size."""
    needs: dict[int, _Needs] = {}
    waiting: dict[int, list[tuple[int, int | None]]] = {}  # child -> (parent, group or None)
    ready: list[int] = []
    stack: list[dict] = [root]
    while stack:
        node = stack.pop()
        if id(node) in needs:
            continue
        need = needs[id(node)] = _Needs()
        all_of, one_of = _parts(node, root)
        for child in all_of:
            if child is False:
                need.pending += 1  # never met
            elif isinstance(child, dict):
                need.pending += 1
                waiting.setdefault(id(child), []).append((id(node), None))
                stack.append(child)
        for group in one_of:
            need.groups.append(any(not isinstance(c, dict) and c is not False for c in group))
            for child in group:
                if isinstance(child, dict):
                    waiting.setdefault(id(child), []).append((id(node), len(need.groups) - 1))
                    stack.append(child)
        if need.pending == 0 and all(need.groups):
            ready.append(id(node))
    met: set[int] = set()
    while ready:
        node_id = ready.pop()
        if node_id in met:
            continue
        met.add(node_id)
        for parent_id, slot in waiting.get(node_id, []):
            parent = needs[parent_id]
            if slot is None:
                parent.pending -= 1
            else:
                parent.groups[slot] = True
            if parent.pending == 0 and all(parent.groups) and parent_id not in met:
                ready.append(parent_id)
    return id(root) in met


def _parts(node: dict, root: dict) -> tuple[list[Any], list[list[Any]]]:
    """The subschemas every value of `node` needs, and the groups it needs one of."""
    all_of: list[Any] = []
    ref = node.get("$ref")
    if isinstance(ref, str):
        all_of.append(_resolve(ref, root))
    if isinstance(node.get("allOf"), list):
        all_of += node["allOf"]
    properties: dict = node["properties"] if isinstance(node.get("properties"), dict) else {}
    required: list = node["required"] if isinstance(node.get("required"), list) else []
    all_of += [
        properties[name] for name in required if isinstance(name, str) and name in properties
    ]
    min_items = node.get("minItems", 0)
    if isinstance(min_items, int) and min_items > 0 and isinstance(node.get("items"), dict | bool):
        all_of.append(node["items"])
    one_of = [node[key] for key in ("anyOf", "oneOf") if isinstance(node.get(key), list)]
    return all_of, [group for group in one_of if group]


def _resolve(ref: str, root: Any) -> Any:
    """A local JSON pointer (`#`, `#/$defs/node`); anything else counts as satisfiable."""
    if ref != _LOCAL_REF and not ref.startswith(_LOCAL_REF + "/"):
        return True
    node = root
    for token in ref[2:].split("/") if ref != _LOCAL_REF else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return True  # a dangling reference: the grammar engine names it
    return node
