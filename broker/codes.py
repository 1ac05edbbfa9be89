"""P2PFaaS's error catalogue (its ``errors/reply_errors.go``): the ``code`` of an error body says which
failure, as P2PFaaS's clients parse it; the HTTP status it is answered with says what kind."""

from __future__ import annotations

GENERIC = 1                  # 500 anything without a more precise code (function error, timeout, ...)
NOT_FOUND = 3                # 404 unknown function, route or call
INPUT_NOT_VALID = 4          # 400 malformed input (also: a body over the size limit, answered 413)
SERVICE_NOT_VALID = 100      # 400 the function named is not valid
DEPLOY_FAILED = 200          # 500 a function could not be deployed
FAAS_ERROR = 300             # 500 the function runtime failed (OpenFaaS routes)
CANNOT_SCHEDULE = 400        # 500 no slot and no queue place: the job cannot be scheduled
DELIBERATELY_REJECTED = 401  # 503 the algorithm (or X-P2pfaas-Scheduler-Reject) refused it
CANNOT_GET_ACTION = 402      # 500 the learner gave no action
FORWARD_FAILED = 403         # 500 the peer could not be reached or went away
PEER_RESPONSE_NIL = 404      # 500 the peer answered nothing usable
NO_RECIPIENT = 405           # 500 the peer an action names does not exist

STATUS = {GENERIC: 500, NOT_FOUND: 404, INPUT_NOT_VALID: 400, SERVICE_NOT_VALID: 400, DEPLOY_FAILED: 500,
          FAAS_ERROR: 500, CANNOT_SCHEDULE: 500, DELIBERATELY_REJECTED: 503, CANNOT_GET_ACTION: 500,
          FORWARD_FAILED: 500, PEER_RESPONSE_NIL: 500, NO_RECIPIENT: 500}


def for_status(http_status: int) -> int:
    """The catalogue code of a failure known only by its HTTP status (validation, function errors)."""
    if http_status == 404:
        return NOT_FOUND
    if 400 <= http_status < 500:
        return INPUT_NOT_VALID
    return GENERIC
