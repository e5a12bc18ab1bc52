"""``GET /openapi.json``: an OpenAPI 3.1 description of the routes the proxy answers itself.

The module routes, the catalogue, health, readiness and metrics. The reverse-proxied OpenAI
routes (``/v1/chat/completions``, ``/v1/*``) are the providers' API and are not described.
The envelope schemas are the shipped ``response-envelope.schema.json``, hoisted into
``components.schemas`` with their references rewritten: one source of truth for the envelope.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any

import orjson
from aiohttp import web

from proxy import __version__, schemas
from proxy.api.access import ROUTE_INDEX, Route, Scope
from proxy.api.app_keys import runtime_of
from proxy.api.errors import json_response
from proxy.contract.errors import BY_CODE
from proxy.module.model import Module
from proxy.state.feedback import SHADOW_SOURCE
from proxy.stream.chunks import CHUNK_SCHEMA_FILE

OPENAPI_VERSION = "3.1.0"
ENVELOPE_FILE = "response-envelope.schema.json"
_DEFINITIONS = "#/definitions/"
_COMPONENTS = "#/components/schemas/"
_JSON = "application/json"


_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "One server-sent event; its data is one chunk (StreamChunk)",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["meta", "chunk", "progress", "final", "error"]},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"$ref": "#/components/schemas/StreamChunk"},
        },
    },
}
_OPTIONS: dict[str, Any] = {
    "type": "object",
    "properties": {"response_mode": {"enum": ["sync", "streaming"]}},
}
_RECOVERY: dict[str, Any] = {
    "type": "object",
    "description": "Resume a dropped stream (spec v2.5 §3.2.6.3)",
    "required": ["session_id"],
    "properties": {
        "session_id": {"type": "string"},
        "last_seq": {"type": "integer", "minimum": 0},
        "last_checkpoint": {"type": "object"},
    },
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _COMPONENTS + name}


def _rewrite_refs(node: Any, prefix: str = "") -> Any:
    """``#/definitions/X`` (draft-07, inside a shipped schema) -> ``#/components/schemas/<prefix>X``."""
    if isinstance(node, dict):
        return {
            key: (
                _COMPONENTS + prefix + value.removeprefix(_DEFINITIONS)
                if key == "$ref" and isinstance(value, str) and value.startswith(_DEFINITIONS)
                else _rewrite_refs(value, prefix)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_rewrite_refs(item, prefix) for item in node]
    return node


def stream_components() -> dict[str, Any]:
    """The shipped stream chunk schema as components ``StreamChunk`` and ``Stream<Definition>``."""
    shipped = schemas.load(CHUNK_SCHEMA_FILE)
    top = {k: v for k, v in shipped.items() if k not in {"$schema", "$id", "definitions"}}
    hoisted = {"Chunk": top, **shipped["definitions"]}
    components: dict[str, Any] = _rewrite_refs({f"Stream{k}": v for k, v in hoisted.items()}, "Stream")
    return components


def envelope_components() -> dict[str, Any]:
    """The shipped envelope schema as OpenAPI components: ``Envelope`` plus its definitions.

    ``$schema``/``$id`` are dropped: an ``$id`` would make the references resolve against the
    spec's URL instead of this document."""
    shipped = schemas.load(ENVELOPE_FILE)
    top = {k: v for k, v in shipped.items() if k not in {"$schema", "$id", "definitions"}}
    components: dict[str, Any] = _rewrite_refs({"Envelope": top, **shipped["definitions"]})
    return components


_OPENAI_ERROR = {
    "type": "object",
    "description": "OpenAI's error body: every answer of the proxy that is not a module answer.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_MODULE_SUMMARY = {
    "type": "object",
    "required": ["id", "object", "name", "version", "tier"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "module"},
        "name": {"type": "string"},
        "version": {"type": "string"},
        "tier": {"type": ["string", "null"]},
        "input_schema": {},
    },
}

_OWN_COMPONENTS: dict[str, Any] = {
    "OpenAIError": _OPENAI_ERROR,
    "ModuleSummary": _MODULE_SUMMARY,
    "ModuleList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": _ref("ModuleSummary")},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "object", "created", "owned_by"],
                    "properties": {
                        "id": {"type": "string"},
                        "object": {"const": "model"},
                        "created": {"type": "integer"},
                        "owned_by": {"type": "string"},
                    },
                },
            },
        },
    },
    "Usage": {
        "type": "object",
        "required": ["object", "client", "team", "window_s", "windows", "budgets", "degraded"],
        "properties": {
            "object": {"const": "usage"},
            "client": {"type": "string"},
            "team": {"type": ["string", "null"]},
            "window_s": {"type": "integer"},
            "windows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["scope", "kind", "limit", "remaining", "reset_s"],
                    "properties": {
                        "scope": {"enum": ["client", "team", "global"]},
                        "kind": {"enum": ["requests", "tokens"]},
                        "limit": {"type": "integer"},
                        "remaining": {"type": "integer"},
                        "reset_s": {"type": "number"},
                    },
                },
            },
            "budgets": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["scope", "period", "limit_usd", "spent_usd", "exceeded"],
                    "properties": {
                        "scope": {"enum": ["client", "team", "global"]},
                        "period": {"enum": ["day", "month"]},
                        "limit_usd": {"type": "number"},
                        "spent_usd": {"type": "number"},
                        "exceeded": {"type": "boolean"},
                    },
                },
            },
            "degraded": {"type": "boolean"},
        },
    },
    "Capabilities": {
        "type": "object",
        "required": ["runtime", "version", "spec_versions", "response_modes", "max_body_bytes"],
        "properties": {
            "runtime": {"const": "cognitive-proxy"},
            "version": {"type": "string"},
            "spec_versions": {"type": "array", "items": {"type": "string"}},
            "conformance_level": {"type": "integer"},
            "response_modes": {"type": "array", "items": {"type": "string"}},
            "max_body_bytes": {"type": "integer", "minimum": 1},
            "modules": {"type": "integer", "minimum": 0},
            "providers": {"type": "array", "items": {"type": "string"}},
            "capabilities": {
                "type": "object",
                "description": "Spec v2.5 §8.1",
                "required": ["streaming", "supported_transports"],
                "properties": {
                    "streaming": {"type": "boolean"},
                    "supported_transports": {"type": "array", "items": {"enum": ["sse", "ndjson"]}},
                    "multimodal": {"type": "object"},
                    "max_media_size_mb": {"type": "number"},
                    "stream_recovery": {"type": "boolean"},
                    "stream_session_ttl_s": {"type": "number"},
                },
            },
        },
    },
    "ExecuteRequest": {
        "type": "object",
        "required": ["input"],
        "properties": {
            "input": {"description": "The module input; checked against the module's input schema."},
            "_options": _OPTIONS,
            "_recovery": _RECOVERY,
        },
    },
    "Health": {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}},
    "Readiness": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"enum": ["ready", "loading"]},
            "policy": {"type": "string"},
            "modules": {"type": "integer", "minimum": 0},
            "module_problems": {"type": "array", "items": {"type": "string"}},
        },
    },
}

_ERROR_STATUS_TEXT = {
    400: "Invalid input (E1xxx), or stream recovery disabled (E4012)",
    401: "Missing or invalid client key",
    403: "Blocked by policy, or a stream recovery with another client key (E4007)",
    404: "Module not installed (E4006)",
    406: "Sync asked of a streaming-only module (E4010)",
    413: "Request body over --max-body-bytes, or media over its size limit (E1011)",
    415: "Media type not supported or not what its bytes are (E1010, E1014)",
    422: "Media could not be fetched (E1012), or no target takes the call's modalities (E4011)",
    429: "Every provider rate limited (E4002), with Retry-After",
    500: "Internal error (E4xxx)",
    502: "Provider failure (E4003)",
    503: "Every provider unavailable, with Retry-After, or none has a required capability (E4001)",
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _openai_errors(*statuses: int) -> dict[str, Any]:
    return {str(s): _json(_ref("OpenAIError"), _ERROR_STATUS_TEXT[s]) for s in statuses}


def _module_name_parameter() -> dict[str, Any]:
    return {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _module_statuses() -> list[int]:
    """Every status a module answer may carry: 200 plus each taxonomy code's status."""
    return sorted({200, *(spec.http_status for spec in BY_CODE.values())})


_FEEDBACK_REQUEST: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["trace_id", "verdict"],
    "properties": {
        "trace_id": {"type": "string", "pattern": "^[A-Za-z0-9._:/=+-]{1,128}$"},
        "verdict": {"enum": ["correct", "incorrect", "partially_correct"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "source": {
            "type": "string",
            "maxLength": 64,
            "not": {"const": SHADOW_SOURCE},
            "description": f"who judged; {SHADOW_SOURCE!r} is the proxy's own judge's (feedback.shadow)",
        },
        "note": {"type": "string", "maxLength": 1000},
        "client": {"type": "string", "maxLength": 64, "description": "whose answer (admin keys only)"},
    },
}
_FEEDBACK_RESULT: dict[str, Any] = {
    "type": "object",
    "required": ["object", "trace_id", "verdict", "score", "replaced", "module", "model"],
    "properties": {
        "object": {"const": "feedback"},
        "trace_id": {"type": "string"},
        "verdict": {"type": "string"},
        "score": {"type": "number"},
        "replaced": {"type": "boolean"},
        "module": {"type": "string"},
        "model": {"type": "string"},
        "confidence": {"type": "number"},
        "confidence_calibrated": {"type": "number"},
    },
}


def _paths() -> dict[str, Any]:
    envelope = _ref("Envelope")
    module_answers = {
        str(status): _json(
            envelope, "Module answer (an envelope)" if status == 200 else _ERROR_STATUS_TEXT[status]
        )
        for status in _module_statuses()
    }
    module_answers["200"]["content"].update(
        {
            "text/event-stream": {"schema": _SSE_EVENT},
            "application/x-ndjson": {"schema": _ref("StreamChunk")},
        }
    )
    api_errors = _openai_errors(401)
    return {
        **_module_paths(module_answers, api_errors),
        **_client_paths(api_errors),
        **_operational_paths(),
        **_usage_and_document_paths(api_errors),
    }


def _module_paths(module_answers: dict[str, Any], api_errors: dict[str, Any]) -> dict[str, Any]:
    """The module routes: execute (an envelope, or a stream), catalogue, manifest."""
    envelope = _ref("Envelope")
    return {
        "/v1/modules/{name}/execute": {
            "post": {
                "operationId": "executeModule",
                "summary": "Run a module; the answer is always a v2.2 envelope",
                "parameters": [_module_name_parameter()],
                "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("ExecuteRequest")}}},
                "responses": {**module_answers, **api_errors, **_openai_errors(413)},
            }
        },
        "/v1/modules": {
            "get": {
                "operationId": "listModules",
                "responses": {"200": _json(_ref("ModuleList"), "Installed modules"), **api_errors},
            }
        },
        "/v1/modules/{name}": {
            "get": {
                "operationId": "getModule",
                "parameters": [_module_name_parameter()],
                "responses": {
                    "200": _json(_ref("ModuleSummary"), "Manifest summary"),
                    "404": _json(envelope, _ERROR_STATUS_TEXT[404]),
                    **api_errors,
                },
            }
        },
    }


def _client_paths(api_errors: dict[str, Any]) -> dict[str, Any]:
    """Feedback, capabilities and the OpenAI model list."""
    return {
        "/v1/feedback": {
            "post": {
                "operationId": "postFeedback",
                "summary": "A verdict on a module answer, by its trace id (the calling key or an admin key)",
                "requestBody": {"required": True, "content": {_JSON: {"schema": _FEEDBACK_REQUEST}}},
                "responses": {
                    "200": _json(_FEEDBACK_RESULT, "Recorded (replaced: an earlier verdict was replaced)"),
                    "400": _json(_ref("OpenAIError"), "Malformed feedback (param names the field)"),
                    "404": _json(_ref("OpenAIError"), "Unknown or expired trace id (trace_not_found)"),
                    "409": _json(_ref("OpenAIError"), "Admin: several clients have the trace id"),
                    **api_errors,
                },
            }
        },
        "/v1/capabilities": {
            "get": {
                "operationId": "capabilities",
                "responses": {"200": _json(_ref("Capabilities"), "Capability declaration"), **api_errors},
            }
        },
        "/v1/models": {
            "get": {
                "operationId": "listModels",
                "responses": {
                    "200": _json(_ref("ModelList"), "Aliases and module:<name> models"),
                    **api_errors,
                },
            }
        },
        "/v1/models/{model}": {
            "get": {
                "operationId": "retrieveModel",
                "parameters": [
                    {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": _json(
                        _OWN_COMPONENTS["ModelList"]["properties"]["data"]["items"], "One listed model"
                    ),
                    "404": _json(_ref("OpenAIError"), "No such model (model_not_found)"),
                    **api_errors,
                },
            }
        },
    }


def _operational_paths() -> dict[str, Any]:
    """Health, readiness and metrics (public routes)."""
    return {
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "responses": {"200": _json(_ref("Health"), "Alive")},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "responses": {
                    "200": _json(_ref("Readiness"), "Policy and modules loaded"),
                    "503": _json(_ref("Readiness"), "Still loading, with Retry-After"),
                },
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text, or OpenMetrics when Accept asks for it",
                        "content": {
                            "text/plain": {"schema": {"type": "string"}},
                            "application/openmetrics-text": {"schema": {"type": "string"}},
                        },
                    }
                },
            }
        },
    }


def _usage_and_document_paths(api_errors: dict[str, Any]) -> dict[str, Any]:
    """The admin usage read, and this document."""
    return {
        "/v1/usage": {
            "get": {
                "operationId": "usage",
                "summary": "A client's current windows and spend (admin keys only)",
                "parameters": [
                    {"name": "client", "in": "query", "required": True, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": _json(_ref("Usage"), "The client's windows and budgets, read without counting"),
                    "400": _json(_ref("OpenAIError"), "No client named (missing_client)"),
                    "401": _json(_ref("OpenAIError"), "No admin key (admin_key_required)"),
                    "403": _json(_ref("OpenAIError"), "Not an admin key (admin_key_required)"),
                    "404": _json(_ref("OpenAIError"), "No such client in the keys file (client_not_found)"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "responses": {"200": _json({"type": "object"}, "This document"), **api_errors},
            }
        },
    }


@cache
def _base_document() -> dict[str, Any]:
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "cognitive-proxy",
            "version": __version__,
            "description": "The proxy's own routes. Module answers are Cognitive Modules v2.2 "
            "envelopes; every other error is OpenAI's error body.",
        },
        "paths": _paths(),
        "components": {
            "schemas": {**envelope_components(), **stream_components(), **_OWN_COMPONENTS},
            "securitySchemes": {
                "clientKey": {"type": "http", "scheme": "bearer"},
                "adminKey": {"type": "http", "scheme": "bearer", "description": "--admin-keys"},
            },
        },
        # {}: no key needed when the proxy runs without --api-keys.
        "security": [{}, {"clientKey": []}],
    }


def _module_execute(module: Module) -> dict[str, Any]:
    """``POST /v1/modules/<module>/execute`` with the module's own input schema as ``input``
    (left open when that schema has references, which would not resolve in this document)."""
    schema = module.input_schema or {}
    refers = "$ref" in orjson.dumps(schema).decode()
    operation = copy.deepcopy(_base_document()["paths"]["/v1/modules/{name}/execute"]["post"])
    operation["operationId"] = f"execute_{module.name}"
    operation["parameters"] = []
    operation["requestBody"]["content"][_JSON]["schema"] = {
        "type": "object",
        "required": ["input"],
        "properties": {"input": {} if refers else schema, "_options": _OPTIONS, "_recovery": _RECOVERY},
    }
    return {"post": operation}


_SECURITY: Mapping[Scope, list[dict[str, list[str]]]] = {
    Scope.PUBLIC: [],
    Scope.ADMIN: [{"adminKey": []}],
    Scope.CLIENT_OR_ADMIN: [{}, {"clientKey": []}, {"adminKey": []}],
}
"""Each scope's ``security`` (``Scope.CLIENT``: the document's default)."""


def document(modules: Sequence[Module], routes: Iterable[Route]) -> dict[str, Any]:
    """The document, with one execute path per installed module (its input schema), the
    installed names offered for the ``name`` parameters, and each operation's security from its
    route's scope (``routes``: the route table)."""
    doc = copy.deepcopy(_base_document())
    for route in routes:
        security = _SECURITY.get(route.scope)
        if security is not None and route.template in doc["paths"]:
            for operation in doc["paths"][route.template].values():
                operation["security"] = copy.deepcopy(security)
    if modules:
        schema = {"anyOf": [{"enum": [m.name for m in modules]}, {"type": "string"}]}
        for path in ("/v1/modules/{name}/execute", "/v1/modules/{name}"):
            for operation in doc["paths"][path].values():
                operation["parameters"][0]["schema"] = schema
    for module in modules:
        doc["paths"][f"/v1/modules/{module.name}/execute"] = _module_execute(module)
    return doc


async def openapi(request: web.Request) -> web.Response:
    """``GET /openapi.json``."""
    registry = runtime_of(request).registry
    modules = [registry.modules[name] for name in registry.names()]
    return json_response(document(modules, request.app[ROUTE_INDEX].values()))
