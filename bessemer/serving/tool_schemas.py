"""JSON schemas of tool calls, as people write them (pydantic's `$defs` and `$ref`, `anyOf`,
enums, nested objects), made into the one schema a forced call is generated under.

A forced call is the object {"name": ..., "arguments": <the tool's parameters>}, one
`anyOf` branch per tool. A tool's `$ref`s point into its own parameters ("#/$defs/Unit",
"#"); inside the wrapper they are rewritten to the parameters' new place, so they resolve
against the parameters, not the wrapper. A recursive schema (a `$ref` cycle) is refused:
a forced call must be able to end.
"""

from __future__ import annotations

import copy

from bessemer.serving.api_error import ApiError


def call_schema(tools: list[tuple[str, dict, bool]]) -> dict:
    """tools: (name, parameters, strict) -> the schema of a call of one of them. Objects a
    schema leaves open are closed (`additionalProperties: false`): a forced call's arguments
    hold the declared properties only, as OpenAI's strict mode does."""
    branches = []
    for i, (name, parameters, _) in enumerate(tools):
        where = "#/properties/arguments" if len(tools) == 1 else f"#/anyOf/{i}/properties/arguments"
        check_refs(parameters, name)
        arguments = close_objects(rebase_refs(copy.deepcopy(parameters), where))
        branches.append({"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
                         "required": ["name", "arguments"], "additionalProperties": False})
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def _nodes(schema):
    """Every dict and list inside `schema`, without recursion (depth is the client's)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        yield node
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend(c for c in children if isinstance(c, (dict, list)))


def rebase_refs(schema: dict, where: str) -> dict:
    """Rewrites local `$ref`s ("#..." pointers) of `schema` to point below `where`."""
    for node in _nodes(schema):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            node["$ref"] = where + node["$ref"][1:]
    return schema


def close_objects(schema: dict) -> dict:
    """Sets `additionalProperties: false` on every object schema that does not say."""
    for node in _nodes(schema):
        if isinstance(node, dict) and (node.get("type") == "object" or "properties" in node) \
                and "additionalProperties" not in node:
            node["additionalProperties"] = False
    return schema


def check_refs(schema: dict, tool: str) -> None:
    """400 unless every `$ref` of `schema` is a local pointer that resolves, and no chain of
    them leads back to where it started."""
    def targets(node) -> list[str]:
        return [n["$ref"] for n in _nodes(node) if isinstance(n, dict) and "$ref" in n]

    state: dict[str, str] = {}  # pointer -> "visiting" | "done"
    for start in targets(schema):
        stack = [(start, iter(targets(resolve(schema, start, tool))))]
        state[start] = "visiting"
        while stack:
            pointer, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[pointer] = "done"
                stack.pop()
            elif state.get(child) == "visiting":
                raise ApiError(400, f"tool {tool!r}: its parameters schema is recursive ($ref {child!r}); "
                                    "a forced call must be finite, so give a schema without cycles", param="tools")
            elif child not in state:
                state[child] = "visiting"
                stack.append((child, iter(targets(resolve(schema, child, tool)))))


def resolve(schema: dict, pointer, tool: str):
    """The node a local JSON pointer ("#", "#/$defs/Unit") names inside `schema`."""
    if not isinstance(pointer, str) or not pointer.startswith("#"):
        raise ApiError(400, f"tool {tool!r}: $ref {pointer!r} is not a local reference ('#/...'); "
                            "put the definitions in the parameters' $defs", param="tools")
    node = schema
    for part in [p for p in pointer[1:].split("/") if p]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(400, f"tool {tool!r}: $ref {pointer!r} does not resolve inside its parameters",
                           param="tools")
    return node
