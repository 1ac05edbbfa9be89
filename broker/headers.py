"""Header names on the wire (P2PFaaS-compatible where P2PFaaS has one): a direct call's answer carries the
same headers over NATS as over HTTP (the HTTP bridge passes them through)."""

VERSION = "X-P2pfaas-Version"                 # the answering node's p2pfaas version
SCHEDULER = "X-P2pfaas-Scheduler"             # the algorithm that decided, with its parameters
BYPASS = "X-P2pfaas-Scheduler-Bypass"         # caller: run it here, whatever the algorithm says
FORWARD = "X-P2pfaas-Scheduler-Forward"       # caller: forward it to a peer
REJECT = "X-P2pfaas-Scheduler-Reject"         # caller: refuse it (a test of the refusal path)
TRACING_ID = "X-P2pfaas-Scheduler-Task-Tracing-Id"   # the caller's id of the task, answered back
TASK_TYPE = "X-P2pfaas-Scheduler-Learning-Task-Type"  # the task's type, part of a LearningScheduler's state
# a LearningScheduler's decision (EID, state, action, epsilon), answered to the caller
LEARNING_EID = "X-P2pfaas-Scheduler-Learning-Eid"
LEARNING_STATE = "X-P2pfaas-Scheduler-Learning-State"
LEARNING_ACTION = "X-P2pfaas-Scheduler-Learning-Action"
LEARNING_EPS = "X-P2pfaas-Scheduler-Learning-Eps"
LEARNING = (LEARNING_EID, LEARNING_STATE, LEARNING_ACTION, LEARNING_EPS)
TIMING_TOTAL = "X-P2pfaas-Timing-Total-Seconds-List"             # per node on the path: arrival to answer
TIMING_SCHEDULING = "X-P2pfaas-Timing-Scheduling-Seconds-List"   # per node: the algorithm's decision
TIMING_PROBING = "X-P2pfaas-Timing-Probing-Seconds-List"         # per node: probing peers' load
TIMING_EXECUTION = "X-P2pfaas-Timing-Execution-Time-Seconds"     # the function's own run
# p2pfaas's own timings, not part of P2PFaaS's scheduling time (only the algorithm's decision)
TIMING_QUEUEING = "X-P2pfaas-Timing-Queueing-Seconds"   # waiting for a worker
TIMING_TRANSIT = "X-P2pfaas-Timing-Transit-Seconds"     # from the caller to the node
# the call came to a pool scaled to zero and waited this long for its first worker (in queueing)
COLD_START = "X-P2pfaas-Cold-Start-Seconds"
EXECUTED_BY = "X-P2pfaas-Executed-By"             # the node that ran it
REJECTED_BY = "X-P2pfaas-Rejected-By"             # the node that refused it
EXTERNALLY_EXECUTED = "X-P2pfaas-Externally-Executed"   # "True": a peer ran it
HOPS = "X-P2pfaas-Hops"                           # forwards so far
PEERS_LIST_ID = "X-P2pfaas-Peers-List-Id"   # JSON array of node ids, origin first
PEERS_LIST_IP = "X-P2pfaas-Peers-List-Ip"   # JSON array of their IP addresses, origin first
LOAD = "X-P2pfaas-Load"                           # /monitoring/load: calls running and queued
MAXLOAD = "X-P2pfaas-Maxload"                     # ... and the most it takes
QUEUE_LENGTH = "X-P2pfaas-Queue-Length"           # ... and its queue
P2PFOG_QUEUE_LENGTH = "X-P2pfog-Queue-Length"   # (sic) the name P2PFaaS answers and probes
CALL_ID = "X-Call-Id"                             # an HTTP call's id (OpenFaaS's name)
CALLBACK_URL = "X-Callback-Url"                   # where an async call's answer is POSTed
# P2PFaaS's discovery protocol: a node polling another's /list says who it is; the answer says
# who answered. Node-to-node calls (/peer/function, polls, probes) carry User-Agent: Machine.
MACHINE_IP = "p2pfaas-machine-ip"                 # P2PFaaS discovery: who polls, who answered
MACHINE_NAME = "p2pfaas-machine-name"             # ... its name
MACHINE_GROUP = "p2pfaas-machine-group-name"      # ... its group
USER_AGENT = "User-Agent"                         # "Machine" on node-to-node HTTP calls
USER_AGENT_MACHINE = "Machine"                    # ... that value
# P2PFaaS's learner API (port 19020 / /learner): the sample in headers, the epsilon it acted with
LEARNER_PREFIX = "X-P2pfaas-Learning-"     # + Eid, State, Action, Reward
LEARNER_EPS = "X-P2pfaas-Eps"                     # the epsilon the learner acted with

# p2pfaas's own (NATS message headers)
MSG_ID = "Nats-Msg-Id"                            # JetStream's de-duplication key
EXPECTED_STREAM = "Nats-Expected-Stream"   # JetStream stores it only in the stream named
STATUS = "X-P2pfaas-Status"                # HTTP-like status of an answer or control reply
RETRY_AFTER = "Retry-After"                       # seconds before trying again (503, 429)
NATS_STATUS = "Status"                     # nats-server's own status line (503: no responders)
NATS_DESCRIPTION = "Description"           # ... and its text (nats-py keys it by an enum equal to this)
SENT_AT = "X-P2pfaas-Sent-At"              # unix time the caller sent the request (transit)
NOTICES = "X-P2pfaas-Processing-Notices"   # a forwarding node that reads "still holding it" (102) replies
SERVICE_ERROR = "Nats-Service-Error"       # the NATS services' standard error headers (control plane)
SERVICE_ERROR_CODE = "Nats-Service-Error-Code"   # ... and its code
DEAD_LETTER_REASON = "X-P2pfaas-Dead-Letter-Reason"     # why it was dead-lettered
DEAD_LETTER_SUBJECT = "X-P2pfaas-Dead-Letter-Subject"   # the task's intake subject (a redrive stores it again)
DEAD_LETTER_AT = "X-P2pfaas-Dead-Letter-At"             # unix time it was dead-lettered
REDRIVEN_FROM = "X-P2pfaas-Redriven-From"               # a redriven task: the call key it had
TIMEOUT = "X-P2pfaas-Timeout-Seconds"      # function timeout asked by the caller
DEADLINE = "X-P2pfaas-Deadline-Seconds"    # QoS deadline of the task (latency budget)
WAIT = "X-P2pfaas-Wait-Seconds"            # how long a direct caller waits for the answer: queued past it, not run
SCHEDULER_NAME = "X-P2pfaas-Scheduler-Name"  # the origin's algorithm, carried with a forward

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUE_VALUES


# request headers a caller may set (the HTTP bridge passes exactly these on)
CALLER_HEADERS = (BYPASS, FORWARD, REJECT, TRACING_ID, TASK_TYPE, TIMEOUT, DEADLINE, WAIT)
