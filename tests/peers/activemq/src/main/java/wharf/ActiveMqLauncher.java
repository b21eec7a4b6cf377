package wharf;

import java.io.File;
import java.util.List;

import org.apache.activemq.broker.BrokerPlugin;
import org.apache.activemq.broker.BrokerService;
import org.apache.activemq.broker.TransportConnector;
import org.apache.activemq.broker.region.policy.IndividualDeadLetterStrategy;
import org.apache.activemq.broker.region.policy.PolicyEntry;
import org.apache.activemq.broker.region.policy.PolicyMap;
import org.apache.activemq.security.AuthenticationUser;
import org.apache.activemq.security.SimpleAuthenticationPlugin;
import org.apache.activemq.store.kahadb.KahaDBPersistenceAdapter;

/**
 * Apache ActiveMQ Classic broker for wharf's tests, started by scripts/activemq.
 *
 * <pre>
 *   java -cp CLASSPATH wharf.ActiveMqLauncher --data-dir DIR [--port PORT]
 *        [--anonymous] [--transformer native|jms|raw]
 * </pre>
 *
 * The broker, named {@code wharf}, has a single AMQP 1.0 connector on
 * 127.0.0.1:PORT (default {@code $WHARF_ACTIVEMQ_PORT}, else 5675) and no
 * OpenWire or other connectors, no JMX. Messages and scheduled messages are
 * kept in KahaDB under DIR. Clients log in with SASL PLAIN as admin/admin;
 * {@code --anonymous} also lets SASL ANONYMOUS in, with the same full access
 * (there is no authorization map).
 *
 * Prints {@code activemq: ready} once the connector accepts connections, and
 * stops cleanly on SIGTERM or SIGINT.
 *
 * What the broker does with AMQP outcomes (activemq-amqp 6.3.1, AmqpSender):
 * {@code released} and {@code modified} put the message back at the end of
 * the same link's outbound queue, not the broker queue; {@code
 * modified{delivery-failed=true}} increments the header's delivery-count.
 * {@code rejected} and {@code modified{undeliverable-here=true}} "poison" the
 * message, which moves it to the dead-letter queue, here {@code DLQ.<queue>}.
 * No RedeliveryPlugin is installed, so the broker never dead-letters on its
 * own redelivery count: the consumer's limit decides. The count lives with
 * the link: a message left unsettled when its link detaches goes back to the
 * queue with delivery-count 0 again.
 */
public final class ActiveMqLauncher {

    private ActiveMqLauncher() {
    }

    public static void main(String[] args) throws Exception {
        String env = System.getenv("WHARF_ACTIVEMQ_PORT");
        int port = env == null || env.isEmpty() ? 5675 : Integer.parseInt(env);
        File dataDir = null;
        boolean anonymous = false;
        // "native" (the activemq-amqp default) keeps each message's AMQP
        // encoding as sent and hands it out unchanged; "jms" converts to JMS
        // messages and back, for interop with OpenWire clients, and changes
        // the encoding (see scripts/activemq).
        String transformer = "native";
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--port" -> port = Integer.parseInt(args[++i]);
                case "--data-dir" -> dataDir = new File(args[++i]);
                case "--anonymous" -> anonymous = true;
                case "--transformer" -> transformer = args[++i];
                default -> {
                    System.err.println("usage: ActiveMqLauncher --data-dir DIR [--port PORT] "
                            + "[--anonymous] [--transformer native|jms|raw]");
                    System.exit(2);
                }
            }
        }
        if (dataDir == null) {
            System.err.println("activemq: --data-dir is required");
            System.exit(2);
        }

        BrokerService broker = new BrokerService();
        broker.setBrokerName("wharf");
        broker.setUseJmx(false);
        // Our own hook below stops the broker and waits for it.
        broker.setUseShutdownHook(false);
        broker.setDataDirectoryFile(dataDir);

        // Persistent KahaDB store, without fsync per write (test broker).
        broker.setPersistent(true);
        KahaDBPersistenceAdapter kahaDb = new KahaDBPersistenceAdapter();
        kahaDb.setDirectory(new File(dataDir, "kahadb"));
        kahaDb.setJournalDiskSyncStrategy("never");
        broker.setPersistenceAdapter(kahaDb);

        // Scheduled delivery: the AMQP message annotations x-opt-delivery-delay
        // and x-opt-delivery-time become AMQ_SCHEDULED_DELAY, kept in a KahaDB
        // job scheduler store.
        broker.setSchedulerSupport(true);
        broker.setSchedulerDirectoryFile(new File(dataDir, "scheduler"));

        // Limits the broker would otherwise warn about at every start and
        // cut down: memory beyond the heap (scripts/activemq gives 512 MiB),
        // stores larger than most disks.
        broker.getSystemUsage().getMemoryUsage().setLimit(256L << 20);
        broker.getSystemUsage().getStoreUsage().setLimit(8L << 30);
        broker.getSystemUsage().getTempUsage().setLimit(4L << 30);
        broker.getSystemUsage().getJobSchedulerUsage().setLimit(4L << 30);

        // Authentication only: admin/admin, and anonymous if asked for. Every
        // authenticated user may do anything.
        SimpleAuthenticationPlugin auth = new SimpleAuthenticationPlugin(
                List.of(new AuthenticationUser("admin", "admin", "admins")));
        auth.setAnonymousAccessAllowed(anonymous);
        broker.setPlugins(new BrokerPlugin[] { auth });

        broker.setDestinationPolicy(policy());
        // Look for idle destinations to delete (see gcInactiveDestinations).
        broker.setSchedulePeriodForDestinationPurge(10_000);

        // wireFormat.maxFrameSize caps an incoming frame and also a whole
        // (multi-frame) message, in bytes: 100 MiB, as in the ActiveMQ
        // distribution's activemq.xml (the default is unlimited). The AMQP
        // max-frame-size the broker announces in its open frame is
        // wireFormat.maxAmqpFrameSize (default 128 KiB).
        TransportConnector amqp = broker.addConnector("amqp://127.0.0.1:" + port
                + "?transport.transformer=" + transformer
                + "&wireFormat.maxFrameSize=104857600");
        amqp.setName("amqp");

        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("activemq: stopping");
            try {
                broker.stop();
                broker.waitUntilStopped();
            } catch (Exception e) {
                e.printStackTrace();
            }
            System.out.println("activemq: stopped");
        }, "wharf-activemq-shutdown"));

        broker.start();
        if (!broker.waitUntilStarted()) {
            System.err.println("activemq: broker failed to start");
            System.exit(1);
        }
        System.out.println("activemq: ready on amqp://127.0.0.1:" + port
                + " (transformer " + transformer + ", anonymous " + anonymous + ")");
        broker.waitUntilStopped();
    }

    /** The policy for every queue and topic. */
    private static PolicyMap policy() {
        // A rejected message (and one modified undeliverable-here) goes to
        // the queue DLQ.<queue>; a topic's to DLQ.<topic>. Non-persistent
        // messages (AMQP header durable=false or no header) are dead-lettered
        // too, not dropped as by default. Expired messages are dropped, as
        // Artemis does without an expiry address.
        IndividualDeadLetterStrategy dlq = new IndividualDeadLetterStrategy();
        dlq.setQueuePrefix("DLQ.");
        dlq.setTopicPrefix("DLQ.");
        dlq.setUseQueueForQueueMessages(true);
        dlq.setUseQueueForTopicMessages(true);
        dlq.setProcessNonPersistent(true);
        dlq.setProcessExpired(false);

        PolicyEntry entry = new PolicyEntry();
        entry.setDestination(new org.apache.activemq.command.ActiveMQQueue(">"));
        entry.setDeadLetterStrategy(dlq);
        // Destinations without consumers and messages go away after 30 s,
        // so test runs against a long-lived broker leave nothing behind.
        entry.setGcInactiveDestinations(true);
        entry.setInactiveTimeoutBeforeGC(30_000);

        PolicyEntry topics = new PolicyEntry();
        topics.setDestination(new org.apache.activemq.command.ActiveMQTopic(">"));
        topics.setDeadLetterStrategy(dlq);
        topics.setGcInactiveDestinations(true);
        topics.setInactiveTimeoutBeforeGC(30_000);

        PolicyMap map = new PolicyMap();
        map.setPolicyEntries(List.of(entry, topics));
        return map;
    }
}
