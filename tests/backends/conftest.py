import pytest

from retool.backends.local import LocalServiceClient


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    return LocalServiceClient(checkpoint_root=tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def sampler(service):
    client = service.create_sampling_client(base_model="tiny-random")
    yield client
    client.close()
