"""Runs the handler in plain Python: python3 -m unittest (no wasm needed)."""

import unittest

import wharf
from app import handle


class FlakyTest(unittest.TestCase):
    def test_outcomes_by_body(self) -> None:
        self.assertEqual(handle(wharf.Delivery(b"ok")), wharf.ack())
        self.assertEqual(handle(wharf.Delivery(b"retry")), wharf.retry())
        self.assertEqual(handle(wharf.Delivery(b"bad")), wharf.drop())
        self.assertEqual(handle(wharf.Delivery(b"later")), wharf.retry_after(1000))

    def test_delay_from_property(self) -> None:
        for value in (1500, "1500"):
            d = wharf.Delivery(b"later", properties=[wharf.Property("delay-ms", value)])
            self.assertEqual(handle(d), wharf.retry_after(1500))
        d = wharf.Delivery(b"later", properties=[wharf.Property("delay-ms", "soon")])
        self.assertEqual(handle(d), wharf.retry_after(1000))

    def test_publish(self) -> None:
        wharf.outputs.clear()
        d = wharf.Delivery(b"publish:out.a", reply_to="rq")
        self.assertEqual(handle(d), wharf.ack())
        sent, replied = wharf.outputs
        self.assertEqual(sent.address, "out.a")
        self.assertEqual(sent.message.body, b"publish:out.a")
        self.assertEqual(sent.message.properties, [wharf.Property("attempt", 1)])
        self.assertEqual(replied, wharf.Output(None, wharf.Message(b"sent to out.a")))
        wharf.outputs.clear()


if __name__ == "__main__":
    unittest.main()
