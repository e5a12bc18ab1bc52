"""The module-call service: one module call for a caller, with no HTTP in it.

``api/`` parses a request into the service's inputs (``module_call.ModuleCall``), calls
``answer_module`` and presents the answer; what the request's log line reports comes back as data
(``module_call.CallReport``), never written into a request.
"""
