"""grpcserver.Registration.of: a servicer mounted by its generated base class's name and adder."""

from __future__ import annotations

import pytest

from agentlearn.prefetch.v1 import knowledge_service_pb2_grpc as legacy_grpc
from agentlearn.prefetch.v1 import prefetch_service_pb2_grpc
from libs.common.grpcserver import Registration


class _Builtins(prefetch_service_pb2_grpc.BuiltinServiceServicer):
    pass


class _Legacy(legacy_grpc.KnowledgeServiceServicer):
    pass


def test_the_name_and_adder_are_the_generated_base_classes() -> None:
    servicer = _Builtins()
    reg = Registration.of(servicer)
    assert reg == Registration(
        "agentlearn.prefetch.v1.BuiltinService",
        prefetch_service_pb2_grpc.add_BuiltinServiceServicer_to_server,
        servicer,
    )


def test_two_services_of_one_name_in_two_packages_stay_apart() -> None:
    reg = Registration.of(_Legacy())
    assert reg.service_name == "agentlearn.prefetch.v1.KnowledgeService"
    assert reg.add is legacy_grpc.add_KnowledgeServiceServicer_to_server


def test_an_object_with_no_generated_base_is_refused() -> None:
    with pytest.raises(TypeError, match="no generated servicer"):
        Registration.of(object())
