"""The API keys a type checker sees (protocol/apis.py's TYPE_CHECKING class) are those of
the enum made from kio at run time: same names, same numbers."""

import ast
import pathlib

from tierproxy.protocol.apis import ApiKey

APIS = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "apis.py"


def _declared() -> dict[str, int]:
    for node in ast.walk(ast.parse(APIS.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "ApiKey":
            return {target.id: ast.literal_eval(item.value)
                    for item in node.body if isinstance(item, ast.Assign)
                    for target in item.targets if isinstance(target, ast.Name)}
    raise AssertionError("no class ApiKey in protocol/apis.py")


def test_declared_keys_are_kios() -> None:
    declared = _declared()
    assert declared, "the class declares no key"
    assert declared == {name: ApiKey[name].value for name in declared}
