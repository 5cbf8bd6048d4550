// A Java consumer (kafka-clients, so fetch sessions are in play) at the tail of every
// partition of a topic, for benchmarks/tail.py. Run with the testbed's Kafka jars:
//
//     java -cp <kafka libs>/* benchmarks/TailLatency.java BOOTSTRAP TOPIC WARMUP_S SECONDS
//
// Prints "window start" and "window end" lines when the measured window opens and closes
// (the caller reads the broker's and the proxy's CPU time at those moments), then one JSON
// line: records seen in the window, end-to-end latency p50/p99/max (now minus the record's
// CreateTime, in ms), and the consumer's own request bytes, requests and Fetch requests in
// the window (consumer-metrics outgoing-byte-total, request-total;
// consumer-fetch-manager-metrics fetch-total).

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.Metric;
import org.apache.kafka.common.MetricName;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class TailLatency {
    public static void main(String[] args) {
        String bootstrap = args[0];
        String topic = args[1];
        long warmupMs = Long.parseLong(args[2]) * 1000;
        long measureMs = Long.parseLong(args[3]) * 1000;
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", "tail-" + UUID.randomUUID());
        props.put("enable.auto.commit", "false");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = new ArrayList<>();
            consumer.partitionsFor(topic).forEach(p -> partitions.add(new TopicPartition(topic, p.partition())));
            consumer.assign(partitions);
            consumer.seekToEnd(partitions);
            partitions.forEach(consumer::position);
            long start = System.currentTimeMillis() + warmupMs;
            long end = start + measureMs;
            double[] before = null;
            List<Long> latencies = new ArrayList<>();
            while (true) {
                long now = System.currentTimeMillis();
                if (now >= end) {
                    break;
                }
                if (before == null && now >= start) {
                    before = requestCounters(consumer.metrics());
                    System.out.println("window start");
                    System.out.flush();
                }
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(100))) {
                    long received = System.currentTimeMillis();
                    if (before != null) {
                        latencies.add(received - record.timestamp());
                    }
                }
            }
            double[] after = requestCounters(consumer.metrics());
            System.out.println("window end");
            System.out.flush();
            Collections.sort(latencies);
            System.out.printf("{\"records\": %d, \"p50_ms\": %s, \"p99_ms\": %s, \"max_ms\": %s, "
                    + "\"request_bytes\": %.0f, \"requests\": %.0f, \"fetches\": %.0f}%n", latencies.size(),
                    quantile(latencies, 0.50), quantile(latencies, 0.99), quantile(latencies, 1.0),
                    after[0] - before[0], after[1] - before[1], after[2] - before[2]);
        }
    }

    private static double[] requestCounters(Map<MetricName, ? extends Metric> metrics) {
        double[] counters = new double[3];
        metrics.forEach((name, metric) -> {
            boolean total = name.tags().get("topic") == null;  // fetch-total exists per topic too
            if (name.group().equals("consumer-metrics") && name.name().equals("outgoing-byte-total")) {
                counters[0] = ((Number) metric.metricValue()).doubleValue();
            } else if (name.group().equals("consumer-metrics") && name.name().equals("request-total")) {
                counters[1] = ((Number) metric.metricValue()).doubleValue();
            } else if (name.group().equals("consumer-fetch-manager-metrics") && name.name().equals("fetch-total")
                    && total) {
                counters[2] = ((Number) metric.metricValue()).doubleValue();
            }
        });
        return counters;
    }

    private static String quantile(List<Long> sorted, double q) {
        if (sorted.isEmpty()) {
            return "null";
        }
        return Long.toString(sorted.get(Math.min(sorted.size() - 1, (int) Math.floor(q * sorted.size()))));
    }
}
