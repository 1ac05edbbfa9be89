"""Message contracts: every JSON payload that crosses a broker (frozen, unknown keys refused), encoded
and decoded only by :mod:`broker.codec`; broker/protocol.py says which subject carries which."""

# ruff: noqa: F401

from broker.messages.base import Contract, FiniteFloat
from broker.messages.calls import (DirectAnswer, ErrorBody, HopTiming, LearningDecision, Rejection, Result,
                                   Timings, WorkerCall, WorkerCalls, WorkerOutcome, WorkerOutcomes, WorkerStatus,
                                   WorkerStatusRequest)
from broker.messages.control import NodeConfiguration, NodeGone, NodeLoad, SchedulerChange, SchedulerConfiguration
from broker.messages.discovery import DiscoveryConfiguration, Heartbeat, MachineAnnouncement, PeerInfo, PeerList
from broker.messages.functions import (DEFAULT_ZERO_AFTER_S, EnvName, FunctionDeployment, FunctionInfo,
                                       FunctionLimits, FunctionList, FunctionScale, FunctionScaling, LabelName,
                                       ScaleDelay, SecretChange, SecretName)
from broker.messages.learner import (LearnerActRequest, LearnerAction, LearnerParameters, LearnerStats,
                                     LearnerTrainBatch, LearnerTrainSample, LearnerWeights, StateVector)
from broker.messages.scaling import (PoolPulse, PoolTelemetry, PolicySwitch, PolicySwitched, ScaleCommand,
                                     ScalingExperience, SchedulingExperience)
