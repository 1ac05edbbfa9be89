"""Header names on the wire (P2PFaaS-compatible where P2PFaaS has one)."""

VERSION = "X-P2pfaas-Version"
SCHEDULER = "X-P2pfaas-Scheduler"
BYPASS = "X-P2pfaas-Scheduler-Bypass"
FORWARD = "X-P2pfaas-Scheduler-Forward"
REJECT = "X-P2pfaas-Scheduler-Reject"
TRACING_ID = "X-P2pfaas-Scheduler-Task-Tracing-Id"
TASK_TYPE = "X-P2pfaas-Scheduler-Learning-Task-Type"
# a LearningScheduler's decision, carried with the task/forward and answered to the caller
LEARNING_EID = "X-P2pfaas-Scheduler-Learning-Eid"
LEARNING_STATE = "X-P2pfaas-Scheduler-Learning-State"
LEARNING_ACTION = "X-P2pfaas-Scheduler-Learning-Action"
LEARNING_EPS = "X-P2pfaas-Scheduler-Learning-Eps"
LEARNING = (LEARNING_EID, LEARNING_STATE, LEARNING_ACTION, LEARNING_EPS)
TIMING_TOTAL = "X-P2pfaas-Timing-Total-Seconds-List"
TIMING_SCHEDULING = "X-P2pfaas-Timing-Scheduling-Seconds-List"
TIMING_PROBING = "X-P2pfaas-Timing-Probing-Seconds-List"
TIMING_EXECUTION = "X-P2pfaas-Timing-Execution-Time-Seconds"
EXTERNALLY_EXECUTED = "X-P2pfaas-Externally-Executed"
HOPS = "X-P2pfaas-Hops"
PEERS_LIST_ID = "X-P2pfaas-Peers-List-Id"
LOAD = "X-P2pfaas-Load"
MAXLOAD = "X-P2pfaas-Maxload"
QUEUE_LENGTH = "X-P2pfaas-Queue-Length"
CALL_ID = "X-Call-Id"
CALLBACK_URL = "X-Callback-Url"

# p2pfaas's own (NATS message headers)
MSG_ID = "Nats-Msg-Id"
TIMEOUT = "X-P2pfaas-Timeout-Seconds"      # function timeout asked by the caller
DEADLINE = "X-P2pfaas-Deadline-Seconds"    # QoS deadline of the task (latency budget)
ARRIVAL = "X-P2pfaas-Arrival"              # unix time the request entered the system
CLIENT = "X-P2pfaas-Client"
REQUEST_ID = "X-P2pfaas-Request-Id"
ORIGIN = "X-P2pfaas-Origin"
SCHEDULED_AT = "X-P2pfaas-Scheduled-At"
SCHEDULING_S = "X-P2pfaas-Scheduling-Seconds"
SCHEDULER_NAME = "X-P2pfaas-Scheduler-Name"
SENT_AT = "X-P2pfaas-Sent-At"
REPLY_TOPIC = "X-P2pfaas-Reply-Topic"
HOP_TIMINGS = "X-P2pfaas-Hop-Timings"      # HopTrail JSON: arrival/scheduling/probing per node so far

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in TRUE_VALUES
