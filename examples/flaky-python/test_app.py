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

    def test_mirror(self) -> None:
        wharf.outputs.clear()
        d = wharf.Delivery(
            b"mirror:out.m",
            properties=[
                wharf.Property("n", wharf.UInt(5)),
                wharf.Property("s", "text"),
                wharf.Property("i", -2),
            ],
            to="orders",
            user_id=b"alice",
            group_id="g",
            group_sequence=7,
            reply_to_group_id="rg",
            creation_time=wharf.Timestamp(1700000000000),
            absolute_expiry_time=wharf.Timestamp(1700000060000),
            priority=9,
            durable=True,
            first_acquirer=True,
            annotations=[
                wharf.Property("x-opt-delivery-time", wharf.Timestamp(1700000001000)),
                wharf.Property("x-opt-wharf-dead-letter-reason", "expired"),
            ],
        )
        self.assertEqual(handle(d), wharf.ack())
        (sent,) = wharf.outputs
        self.assertEqual(sent.address, "out.m")
        m = sent.message
        self.assertEqual(m.body, b"mirror:out.m")
        self.assertEqual(
            (m.group_id, m.group_sequence, m.reply_to_group_id), ("g", 7, "rg")
        )
        self.assertEqual((m.creation_time, m.absolute_expiry_time), (1700000000000, 1700000060000))
        self.assertIsInstance(m.creation_time, wharf.Timestamp)
        self.assertEqual((m.priority, m.durable), (9, True))
        self.assertEqual(
            m.properties,
            [
                wharf.Property("n", 5),
                wharf.Property("s", "text"),
                wharf.Property("i", -2),
                wharf.Property("to", "orders"),
                wharf.Property("user-id", b"alice"),
                wharf.Property("first-acquirer", True),
                wharf.Property("annotation:x-opt-delivery-time", 1700000001000),
                wharf.Property("annotation:x-opt-wharf-dead-letter-reason", "expired"),
            ],
        )
        # The values keep their AMQP types: uint, timestamp.
        self.assertIsInstance(m.properties[0].value, wharf.UInt)
        self.assertIsInstance(m.properties[6].value, wharf.Timestamp)
        wharf.outputs.clear()

    def test_mirror_bare(self) -> None:
        wharf.outputs.clear()
        self.assertEqual(handle(wharf.Delivery(b"mirror:out.m")), wharf.ack())
        (sent,) = wharf.outputs
        self.assertEqual(
            sent,
            wharf.Output(
                "out.m",
                wharf.Message(
                    b"mirror:out.m",
                    properties=[wharf.Property("first-acquirer", False)],
                    durable=False,
                    priority=4,
                ),
            ),
        )
        wharf.outputs.clear()


if __name__ == "__main__":
    unittest.main()
