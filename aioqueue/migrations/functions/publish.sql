-- One event, from SQL or a trigger: SELECT aioqueue.publish('orders', 'order-17', '{"paid": true}').
CREATE OR REPLACE FUNCTION {schema}.publish(stream text, key text, payload jsonb) RETURNS bigint
LANGUAGE sql
AS $$SELECT {schema}.publish_events(stream, ARRAY[key], ARRAY[payload])$$;
