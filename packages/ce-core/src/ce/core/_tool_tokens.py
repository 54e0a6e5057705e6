"""What function (tool) definitions cost in a chat prompt: the text OpenAI is known to render
them as, which :meth:`ce.core.tokens.TokenEstimator.estimate_tools` counts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["render_functions"]


# --- how OpenAI renders function definitions into the prompt --------------------------------
#
# OpenAI does not publish the rendering; the known approximation (inferred from API usage
# figures, see github.com/hmarr/openai-chat-tokens) is a TypeScript-like namespace:
#
#   namespace functions {
#
#   // <description>
#   type <name> = (_: {
#   // <property description>
#   <property>?: <type>,       (no "?" for required properties)
#   }) => any;
#
#   } // namespace functions
#
# plus ``ce.core.tokens.TOOLS_OVERHEAD_TOKENS``. Counts match the API exactly for simple
# schemas; when the prompt also has a system message the API reports 4 tokens fewer (the
# definitions share it), so this errs on the safe side.


def _function_of(tool: dict[str, Any]) -> dict[str, Any]:
    inner = tool.get("function")
    return inner if isinstance(inner, dict) else tool


def render_functions(tool_schemas: Sequence[dict[str, Any]]) -> str:
    """``tool_schemas`` as the prompt text they are counted as (see above)."""
    lines = ["namespace functions {", ""]
    for tool in tool_schemas:
        function = _function_of(tool)
        description = function.get("description")
        if description:
            lines.append(f"// {description}")
        parameters = function.get("parameters")
        name = function.get("name", "")
        if isinstance(parameters, dict) and parameters.get("properties"):
            lines.append(f"type {name} = (_: {{")
            lines.append(_render_properties(parameters, 0))
            lines.append("}) => any;")
        else:
            lines.append(f"type {name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _render_properties(schema: dict[str, Any], indent: int) -> str:
    required = schema.get("required") or ()
    lines: list[str] = []
    for prop_name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        if prop.get("description"):
            lines.append(f"// {prop['description']}")
        optional = "" if prop_name in required else "?"
        lines.append(f"{prop_name}{optional}: {_render_type(prop, indent)},")
    return "\n".join(" " * indent + line for line in lines)


def _render_type(prop: dict[str, Any], indent: int) -> str:
    if "enum" in prop and isinstance(prop["enum"], list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in prop["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(prop.get(key), list):
            return " | ".join(
                _render_type(p if isinstance(p, dict) else {}, indent) for p in prop[key]
            )
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(_render_type({**prop, "type": k}, indent) for k in kind)
    if kind in ("string", "boolean", "null"):
        return str(kind)
    if kind in ("number", "integer"):
        return "number"
    if kind == "array":
        items = prop.get("items")
        return f"{_render_type(items, indent)}[]" if isinstance(items, dict) else "any[]"
    if kind == "object" and prop.get("properties"):
        return "\n".join(["{", _render_properties(prop, indent + 2), "}"])
    if kind == "object":
        return "object"
    return "any"
