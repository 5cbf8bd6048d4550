"""SASL exchanges against the RFC test vectors: what goes on the wire is exact."""

import base64

import pytest

from tierproxy.client.sasl import Credentials, Plain, SaslError, Scram, mechanism


def test_plain_message_is_authzid_user_password():
    assert Plain(Credentials("alice", "s3cret")).first() == b"\0alice\0s3cret"


def test_scram_sha256_matches_rfc7677():
    scram = Scram(Credentials("user", "pencil"), "SCRAM-SHA-256", nonce="rOprNGfwEbeRWgbNEkqO")
    assert scram.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = scram.respond(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                          b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    server_final = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert scram.respond(server_final) is None
    scram.finish(server_final)


def test_scram_rejects_a_server_that_does_not_know_the_password():
    scram = Scram(Credentials("user", "pencil"), "SCRAM-SHA-256", nonce="abc")
    scram.respond(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(SaslError, match="signature does not match"):
        scram.finish(b"v=" + base64.b64encode(b"\0" * 32))


def test_scram_rejects_a_nonce_it_did_not_start():
    scram = Scram(Credentials("user", "pencil"), "SCRAM-SHA-512", nonce="abc")
    with pytest.raises(SaslError, match="malformed"):
        scram.respond(b"r=xyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")


def test_scram_escapes_user_names():
    scram = Scram(Credentials("a=b,c", "p"), "SCRAM-SHA-512", nonce="n")
    assert scram.first() == b"n,,n=a=3Db=2Cc,r=n"


def test_unknown_mechanism_and_hidden_password():
    with pytest.raises(ValueError, match="GSSAPI"):
        mechanism("GSSAPI", Credentials("u", "p"))
    assert "p4ss" not in repr(Credentials("u", "p4ss"))
